# Image for the worker and the producers (same image, different command).
# Build: docker build -t scrape-fleet:local .   (docker-compose.yml does this for you)
FROM python:3.11.11-slim-bookworm

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# A fixed, unprivileged user; the code stays owned by root so the worker cannot change it.
RUN groupadd --system --gid 10001 scraper \
    && useradd --system --uid 10001 --gid scraper --no-create-home --shell /usr/sbin/nologin scraper

# Dependencies first: this layer is rebuilt only when requirements.txt changes.
COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt

COPY . .

USER 10001:10001

# Exec form, so python itself receives SIGTERM (compose adds `init: true` to reap children).
CMD ["python", "worker.py"]
