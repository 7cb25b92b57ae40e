# The exporter's image for deploy/kubernetes/: `docker build -t <registry>/rdma-exporter:<tag> .` with a
# tag of its own for every build (`git describe --always --dirty`), push it, and set that name as the
# DaemonSet's image in your overlay (docs/operations.md, Kubernetes). It reads the host's /sys (mounted at /host/sys) and
# needs no tools from the image: the ethtool statistics come from the ioctl, uevents from libudev.
# The Debian release is named: a bare `slim` moves to the next one (and its libudev) when it is released.
FROM python:3.11-slim-bookworm AS build
COPY . /src
# The dependencies at the versions the test suite ran (deploy/constraints.txt), and the exporter's own
# wheel built with the pinned setuptools: a rebuild months later ships the same. PIP_CONSTRAINT, not
# --constraint: up to pip 25.2 only the environment reaches the isolated build environment, and pip 25.3
# and later take the build's pins from PIP_BUILD_CONSTRAINT (older pips ignore it).
# tests/test_packaging.py runs these two pip steps as written.
RUN PIP_CONSTRAINT=/src/deploy/constraints.txt PIP_BUILD_CONSTRAINT=/src/deploy/constraints.txt \
    pip wheel --no-cache-dir --wheel-dir /wheels /src

FROM python:3.11-slim-bookworm
# pyudev loads libudev at run time for the uevent monitor; without it the exporter rescans every scrape.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libudev1 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index /wheels/*.whl && rm -rf /wheels
# The DaemonSet's runAsUser; no file in the image needs to belong to it.
USER 65534:65534
EXPOSE 9883
ENTRYPOINT ["rdma-exporter"]
