# The image atoll's manifests run for vllm-router, the prefill/decode router of a disaggregated
# model (kubernetes.router: vllm-router, the default). The vLLM project publishes the router on
# PyPI only, so build this and push it where your cluster pulls from:
#
#   docker build -t REGISTRY/vllm-router:0.1.17 -f control/data/vllm-router.Dockerfile control/data
#   docker push REGISTRY/vllm-router:0.1.17
#
# then name it in the fleet file: kubernetes: {router_image: REGISTRY/vllm-router:0.1.17}.
# The version is the one atoll pins and checks its flags against (control/k8s/vllm.py,
# VLLM_ROUTER_VERSION); the wheel is built for linux/amd64 (manylinux_2_28 x86_64).
FROM python:3.12-slim
ARG VLLM_ROUTER_VERSION=0.1.17
RUN pip install --no-cache-dir "vllm-router==${VLLM_ROUTER_VERSION}" \
    && useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin router
USER 10001
# 8000: the router (atoll renders --port from kubernetes.port); 29000: Prometheus metrics
EXPOSE 8000 29000
CMD ["vllm-router", "--help"]
