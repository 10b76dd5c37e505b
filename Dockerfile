FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY kmq ./kmq
COPY tracker ./tracker
RUN pip install --no-cache-dir ".[proxy]"
USER nobody
CMD ["kmq-tracker"]
