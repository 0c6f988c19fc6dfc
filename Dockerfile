# Image for the worker and the producers (same image, different command).
# Build: docker build -t scrape-fleet:local .   (docker-compose.yml does this for you)

# The base image, by tag and by digest: a tag can be re-pushed, a digest cannot. PYTHON_DIGEST
# is the tag's digest ("sha256:" and 64 hex digits, the multi-arch index digest printed by
# `docker buildx imagetools inspect python:3.11.11-slim-bookworm`). Its default is empty (the
# tag alone) until a registry is reachable to read it; set the default here then, and until
# then pass it: docker build --build-arg PYTHON_DIGEST=sha256:... .
ARG PYTHON_DIGEST=
FROM python:3.11.11-slim-bookworm${PYTHON_DIGEST:+@}${PYTHON_DIGEST}

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# A fixed, unprivileged user; the code stays owned by root so the worker cannot change it.
RUN groupadd --system --gid 10001 scraper \
    && useradd --system --uid 10001 --gid scraper --no-create-home --shell /usr/sbin/nologin scraper

# Dependencies first: this layer is rebuilt only when the lock changes. requirements.lock is
# generated from requirements.txt (see its header): every package, direct or indirect, pinned
# with its sha256 hashes; pip refuses anything else, and wheels only (no setup.py runs).
COPY requirements.lock .
RUN pip install --no-cache-dir --require-hashes --only-binary=:all: -r requirements.lock

COPY . .

# The files sink's volume (compose: sink-files) takes this directory's owner when created.
RUN mkdir -p /data/results && chown 10001:10001 /data/results

USER 10001:10001

# Exec form, so python itself receives SIGTERM (compose adds `init: true` to reap children).
CMD ["python", "worker.py"]
