# One image for every think-jobs role (migrate, worker, beat, web); configure with THINK_JOBS_*.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app

COPY pyproject.toml README.md constraints.txt ./
COPY think_jobs ./think_jobs
COPY web ./web
RUN pip install -c constraints.txt ".[postgres,openai]" gunicorn \
    && useradd --create-home --uid 10001 think
USER think

# THINK_JOBS_APP names your ThinkJobs object (module:attribute); mount or COPY your agents.
ENV THINK_JOBS_APP=think_jobs.examples:jobs
EXPOSE 8000
CMD ["think-jobs", "worker", "-c", "8"]
