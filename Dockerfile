# veil serve in a container: the OIP v2 REST (8000) and gRPC (8001) fronts over a model repository mounted at
# /models (the Triton layout: <model>/config.pbtxt, <model>/<version>/model.onnx, veil.json...). See docs/deploy.md.
#
#   docker build -t veil:0.1 .                                          # serve + codec (ONNX, adapters, HE, codec)
#   docker build -t veil:0.1-sampler --build-arg EXTRAS=serve,codec,train .   # + PriorGuide samplers (torch)
#   docker run --rm -p 8000:8000 -p 8001:8001 -v $PWD/models:/models:ro veil:0.1
#   docker run ... -e VEIL_ADMIN_TOKEN=s3cret veil:0.1                  # enables the repository API
#
# A read-only repository is fine: HE evaluation keys go to /keys (mount a volume to keep them across restarts,
# shared storage when several replicas serve the same HE models).
FROM python:3.11-slim

ARG EXTRAS=serve,codec
# the CPU build of torch (only pulled in by the train extra); a CUDA image would start from nvidia/cuda instead
ARG PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1

WORKDIR /src
# .dockerignore keeps .venv, .git, tests, benchmarks and docs out of the build context
COPY . .
RUN pip install --extra-index-url "$PIP_EXTRA_INDEX_URL" ".[${EXTRAS}]" \
 && useradd --system --uid 10001 --home-dir /nonexistent veil \
 && mkdir -p /models /keys && chown veil /keys

USER veil
EXPOSE 8000 8001
# /v2/health/ready answers 200 once every model is loaded and warmed up (Kubernetes readiness probe)
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s \
  CMD python -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/v2/health/ready').status != 200)"
ENTRYPOINT ["veil", "serve", "--host", "0.0.0.0", "--port", "8000", "--grpc-port", "8001", \
            "--repo", "/models", "--he-key-dir", "/keys"]
CMD ["--log-level", "info"]
