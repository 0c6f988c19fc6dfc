# Image for the worker and the producers (same image, different command), and, from the same
# file, the render workers' image (target `renderer`: the same plus Debian's Chromium and
# Playwright).
# Build: docker build -t scrape-fleet:local .   (`docker compose build` does this for you: the
# `image` service of docker-compose.override.yml, the one service that builds it)
# Render image: docker build --target renderer -t scrape-fleet-render:local .
# (`docker compose --profile render build`: the `render-image` service of the override).
# The last stage (`scraper`) is what a build without --target gives: the plain image.

# The base image, by tag and by digest: a tag can be re-pushed, a digest cannot. PYTHON_DIGEST
# is the tag's digest ("sha256:" and 64 hex digits, the multi-arch index digest printed by
# `docker buildx imagetools inspect python:3.11.11-slim-bookworm`). Its default is empty (the
# tag alone) until a registry is reachable to read it; set the default here then, and until
# then pass it: docker build --build-arg PYTHON_DIGEST=sha256:... .
ARG PYTHON_DIGEST=
FROM python:3.11.11-slim-bookworm${PYTHON_DIGEST:+@}${PYTHON_DIGEST} AS runtime

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

# The C hot loops (common/work/_text_measure.c, _links.c and _scan.c, NOTES #83), compiled in a stage
# of their own so that no compiler is left in the images; both images copy the built modules
# from /native. With --optional, an interpreter without its headers builds nothing (it says
# why) and the fleet uses its Python passes (~10 % more CPU a page; the worker says so).
FROM runtime AS native
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb
COPY common/ops/native.py common/ops/native.py
COPY common/work/_text_measure.c common/work/_links.c common/work/_scan.c common/work/_module.h \
     common/work/
RUN python common/ops/native.py --optional \
    && mkdir /native && find common -name '*.so' -exec cp {} /native/ \;

# The render workers (`python worker.py --render`, docs/deployment.md "Render workers"):
# Debian's chromium (no browser download is possible, nor wanted: the distribution patches it)
# and Playwright from requirements-render.lock. `playwright install` is never run: the driver
# launches BROWSER_EXECUTABLE. libatomic1: the Node binary in Playwright's wheel links it
# (without it the driver exits at start: "Connection closed while reading from the driver").
# Fonts: Liberation (metric-compatible with Arial, Times and Courier) and DejaVu, enough for
# layout; text in any script reaches the DOM, which is what the fleet reads, without its fonts. Playwright launches Chromium with --no-sandbox (its default,
# and Debian's chromium has no setuid sandbox helper); the container is the confinement: uid
# 10001, no capabilities, no new privileges, a read-only root.
# Not pinned to a version: Debian's security archive keeps only the newest chromium build, so a
# pin would stop building at its next security update (and an old Chromium is the risk).
FROM runtime AS renderer
USER 0
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends chromium fonts-liberation fonts-dejavu-core \
       libatomic1 \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb
COPY requirements-render.lock .
RUN pip install --no-cache-dir --require-hashes --only-binary=:all: -r requirements.lock \
        -r requirements-render.lock
ENV BROWSER_EXECUTABLE=/usr/bin/chromium
COPY . .
COPY --from=native /native/ common/work/
# As in the `scraper` stage below (the comments there).
RUN python -m compileall -q common scrape_fleet ./*.py \
    && mkdir -p /data/results /data/archive /data/spool /app/extensions \
    && chown 10001:10001 /data/results /data/archive /data/spool \
    && find / -xdev -type f -perm /6000 -exec chmod a-s {} +

USER 10001:10001
# init: true (compose) reaps the Chromium processes that the driver leaves to PID 1.
CMD ["python", "worker.py", "--render"]

# The plain image, last so that a build without --target gives it: no browser, no Playwright.
FROM runtime AS scraper
COPY . .
COPY --from=native /native/ common/work/

# The files sink's volume (compose: sink-files), the WARC archive's (warc-archive) and the
# download workers' spool volumes take
# these directories' owner when created.
# /app/extensions stays root's: user code is read, never written, by the fleet.
# No setuid/setgid file is left in the image: nothing in it can raise its privileges, which
# is what no-new-privileges (compose's security_opt) ensures and Swarm cannot (it drops
# security_opt); with the non-root user and cap_drop ALL, which Swarm keeps.
# The fleet's modules compiled to bytecode here: with PYTHONDONTWRITEBYTECODE (and a code
# directory the worker cannot write) every container start would compile them again, ~0.1 s
# of CPU each (NOTES #81).
RUN python -m compileall -q common scrape_fleet ./*.py \
    && mkdir -p /data/results /data/archive /data/spool /app/extensions \
    && chown 10001:10001 /data/results /data/archive /data/spool \
    && find / -xdev -type f -perm /6000 -exec chmod a-s {} +

USER 10001:10001

# Exec form, so python itself receives SIGTERM (compose adds `init: true` to reap children).
# No ENTRYPOINT: a compose `command:` or `docker run IMAGE python SCRIPT.py` is the whole argv.
CMD ["python", "worker.py"]
