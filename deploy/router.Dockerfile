# sglang-router, the cache-aware router the minnow replicas sit behind (docs/deploy.md), at the
# release the repository's router test runs.
#
#   docker build -f deploy/router.Dockerfile -t minnow-router deploy
FROM python:3.11-slim
RUN pip install --no-cache-dir sglang-router==0.3.2 \
    && useradd --system --uid 10002 --no-create-home router
USER 10002
EXPOSE 30000
ENTRYPOINT ["python", "-m", "sglang_router.launch_router"]
