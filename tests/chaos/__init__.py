"""The chaos suite: kmq under SIGKILLs, tracker fail-overs, network faults and skewed clocks."""
