# The image every service in docker-compose.yml runs: the receipts package with its migrations.
FROM python:3.12-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY proxy_addon ./proxy_addon
COPY migrations ./migrations
COPY config.yaml ./config.yaml
# editable: the CLI finds migrations/ beside the package
RUN pip install --no-cache-dir -e . && useradd --create-home receipts && chown receipts /app
USER receipts
EXPOSE 8080
ENTRYPOINT ["receipts"]
CMD ["proxy", "--config", "/app/config.yaml", "--listen-host", "0.0.0.0", "--listen-port", "8080"]
