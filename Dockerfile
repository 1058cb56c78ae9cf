# The image every service in docker-compose.yml runs: receipts installed from its wheel, as from a package index.
# The build stage builds the wheel (setup.py lays migrations/ and the default config into it); the image installs
# that wheel alone, with no source tree, and runs as a user of its own.
FROM python:3.12-slim AS build
WORKDIR /src
COPY pyproject.toml setup.py README.md LICENSE config.yaml ./
COPY proxy_addon ./proxy_addon
COPY migrations ./migrations
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.12-slim
COPY --from=build /wheels /tmp/wheels
RUN pip install --no-cache-dir /tmp/wheels/*.whl && rm -rf /tmp/wheels \
    && useradd --create-home receipts && mkdir /app && chown receipts /app
USER receipts
WORKDIR /app
# the default config, from the installed package (docker-compose.yml mounts ./config.yaml over it); relative paths
# in it (the SQLite file, the secret and audit key files) are in /app, which this user owns
RUN receipts init --config /app/config.yaml
EXPOSE 8080
ENTRYPOINT ["receipts"]
CMD ["proxy", "--config", "/app/config.yaml", "--listen-host", "0.0.0.0", "--listen-port", "8080"]
