"""Kubernetes: a plan as objects a cluster runs.

- :mod:`~atoll.control.k8s.render`: the plan as vLLM workloads, Services, the router and its
  ConfigMap;
- :mod:`~atoll.control.k8s.nodes`: which nodes a pod may land on, per cloud;
- :mod:`~atoll.control.k8s.vllm`: what the pinned vLLM release accepts;
- :mod:`~atoll.control.k8s.validate`: objects checked as a named Kubernetes version's API server
  would check them;
- :mod:`~atoll.control.k8s.apply`: the plan sinks (manifests in a folder, server-side apply);
- :mod:`~atoll.control.k8s.scale`: desired replicas as metrics, for a cluster's own autoscaler;
- :mod:`~atoll.control.k8s.router`: the built-in prefill/decode router, a standard-library
  program shipped in a ConfigMap.
"""
