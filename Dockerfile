# compaction-proxy: `serve`, configured by environment (COMPACTION_PROXY_* and REDIS_URL;
# see docs/running.md). Without REDIS_URL it starts its embedded redis-server, whose data is
# kept in the volume below.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN groupadd --system --gid 10001 proxy \
    && useradd --system --uid 10001 --gid proxy --create-home --home-dir /home/proxy proxy \
    && mkdir -p /var/lib/compaction-proxy \
    && chown proxy:proxy /var/lib/compaction-proxy

WORKDIR /app
COPY pyproject.toml README.md ./
COPY proxy ./proxy
# No extras: the CI smoke step (.ci/readme_smoke.py) runs this same line on these files.
RUN pip install --no-cache-dir . && rm -rf /root/.cache

# Listen on every interface of the container; the embedded Redis keeps its data in the
# volume. Override any setting with its COMPACTION_PROXY_* variable.
ENV COMPACTION_PROXY_SERVER_HOST=0.0.0.0 \
    COMPACTION_PROXY_SERVER_PORT=8080 \
    COMPACTION_PROXY_STORE_STATE_DIR=/var/lib/compaction-proxy
VOLUME ["/var/lib/compaction-proxy"]

USER 10001:10001
EXPOSE 8080
# /healthz answers while the process runs (readiness, /readyz, is for load balancers).
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('COMPACTION_PROXY_SERVER_PORT', '8080'), timeout=2)"]
# SIGTERM drains: readiness fails, open streams finish within server.drain_timeout.
STOPSIGNAL SIGTERM
ENTRYPOINT ["compaction-proxy"]
CMD ["serve"]
