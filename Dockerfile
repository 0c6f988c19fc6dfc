# Image for the worker and the producers (same image, different command).
# Build: docker build -t scrape-fleet:local .   (`docker compose build` does this for you: the
# `image` service of docker-compose.override.yml, the one service that builds)

# The base image, by tag and by digest: a tag can be re-pushed, a digest cannot. PYTHON_DIGEST
# is the tag's digest ("sha256:" and 64 hex digits, the multi-arch index digest printed by
# `docker buildx imagetools inspect python:3.11.11-slim-bookworm`). Its default is empty (the
# tag alone) until a registry is reachable to read it; set the default here then, and until
# then pass it: docker build --build-arg PYTHON_DIGEST=sha256:... .
ARG PYTHON_DIGEST=
FROM python:3.11.11-slim-bookworm${PYTHON_DIGEST:+@}${PYTHON_DIGEST}

# User code (EXTRACTOR=package.module:function) and rules files (EXTRACT_RULES=@/path) live in
# /app/extensions, which is on PYTHONPATH. Two ways to put them there:
#   - mount a directory: compose mounts ./extensions read-only (docker-compose.override.yml),
#     e.g. EXTRACTOR=mysite.extract:extract for ./extensions/mysite/extract.py and
#     EXTRACT_RULES=@/app/extensions/rules.yml;
#   - derive an image (Swarm, Kubernetes: every node gets the code with the image), from a
#     directory holding the code and this two-line Dockerfile:
#         FROM scrape-fleet:local
#         COPY . /app/extensions/
#     docker build -t my-fleet:1 extensions/   then FLEET_IMAGE=my-fleet:1 (compose, Swarm) or
#     the image name in the kustomize overlay (Kubernetes).
# The base image itself never carries ./extensions (.dockerignore).
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONPATH=/app/extensions

WORKDIR /app

# A fixed, unprivileged user; the code stays owned by root so the worker cannot change it. Its
# HOME exists (libraries that look there find it; compose's root filesystem is read-only).
RUN groupadd --system --gid 10001 scraper \
    && useradd --system --uid 10001 --gid scraper --create-home --home-dir /home/scraper \
       --shell /usr/sbin/nologin scraper

# Dependencies first: this layer is rebuilt only when the lock changes. requirements.lock is
# generated from requirements.txt (see its header): every package, direct or indirect, pinned
# with its sha256 hashes; pip refuses anything else, and wheels only (no setup.py runs).
COPY requirements.lock .
RUN pip install --no-cache-dir --require-hashes --only-binary=:all: -r requirements.lock

COPY . .

# The files sink's volume (compose: sink-files) and the WARC archive's (warc-archive) take
# these directories' owner when created.
# /app/extensions stays root's: user code is read, never written, by the fleet.
# No setuid/setgid file is left in the image: nothing in it can raise its privileges, which
# is what no-new-privileges (compose's security_opt) ensures and Swarm cannot (it drops
# security_opt); with the non-root user and cap_drop ALL, which Swarm keeps.
RUN mkdir -p /data/results /data/archive /app/extensions \
    && chown 10001:10001 /data/results /data/archive \
    && find / -xdev -type f -perm /6000 -exec chmod a-s {} +

USER 10001:10001

# Exec form, so python itself receives SIGTERM (compose adds `init: true` to reap children).
# No ENTRYPOINT: a compose `command:` or `docker run IMAGE python SCRIPT.py` is the whole argv.
CMD ["python", "worker.py"]
