# lockwarden: fenced distributed locks for Kubernetes.
#
# Two commands do all set-up on a fresh machine:
#   make demo   the paused-holder story on a local control plane (etcd + kube-apiserver)
#   make test   the whole test suite (unit, envtest, end-to-end)
# While editing: make test-unit (seconds, no tools), then make test-envtest
# and make test-e2e, which together run what make test runs.

SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec

LOCALBIN ?= $(CURDIR)/bin
# The targets for a cluster (install, deploy, build-installer, ...) use the
# kubectl in bin/ when there is one, else the user's own: none of them
# builds the local control plane.
KUBECTL ?= $(if $(wildcard $(LOCALBIN)/kubectl),$(LOCALBIN)/kubectl,kubectl)
CONTROLLER_GEN ?= $(LOCALBIN)/controller-gen
GOLANGCI_LINT ?= $(LOCALBIN)/golangci-lint
HELM ?= $(LOCALBIN)/helm
DIST ?= $(CURDIR)/dist
# The release: VERSION names the image tag, the archives and --version.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
IMAGE_REPO ?= ghcr.io/lockwarden/lockwarden
IMG ?= $(IMAGE_REPO):$(VERSION)
# The architectures of `make image` and of the plugin archives.
IMAGE_ARCHS ?= amd64 arm64
# On Windows, `run` has no process group and no SIGTERM: the command is
# killed at the grace deadline.
PLUGIN_PLATFORMS ?= linux/amd64 linux/arm64 darwin/amd64 darwin/arm64 windows/amd64
VERSION_LDFLAGS = -X github.com/lockwarden/lockwarden/internal/version.Version=$(VERSION) -X github.com/lockwarden/lockwarden/internal/version.Revision=$(REVISION)
# make uninstall / make undeploy keep the CRDs (and with them every
# FenceCounter and the FenceIssuer) unless DELETE_CRDS=true.
DELETE_CRDS ?= false
# envtest finds kube-apiserver and etcd here (built by hack/build-tools.sh).
# Set to another directory (setup-envtest's, as kubebuilder users have one),
# its kube-apiserver, etcd and kubectl are linked into bin/, not built.
export KUBEBUILDER_ASSETS ?= $(LOCALBIN)
GO_TEST_FLAGS ?= -count=1 -timeout 25m
# The test module (its own go.mod, requiring the product module by a replace):
# the integration, end-to-end, restore, install and chaos suites and the
# programs behind demo, bench, chaos and faults, so that the product's go.mod
# requires none of their dependencies. Every Go target covers both modules.
TEST_MODULE := test
# The test module's packages of make test-e2e: the end-to-end suites (the
# binaries as a user runs them) and those that build real binaries or run
# bin/'s helm and etcdutl. Every other package of both modules is make
# test-envtest's, so that a new package is in one of the two, and make test
# (both modules' ./...) runs what the two run together.
E2E_PACKAGES := ./e2e/... ./chart/... ./install/... ./restore/... ./chaos/... ./image/... ./cluster/...
# make test-unit keeps go's test cache: an unchanged package reports (cached).
UNIT_TEST_FLAGS ?= -timeout 5m

.PHONY: all
all: build

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "\nUsage:\n  make \033[36m<target>\033[0m\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-15s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) } ' $(MAKEFILE_LIST)

##@ Development

.PHONY: manifests
manifests: controller-gen ## Generate CRDs and RBAC from the Go markers (webhook manifests are written by hand), then the Helm chart's copies.
	$(CONTROLLER_GEN) crd paths="./api/..." output:crd:artifacts:config=config/crd/bases
	$(CONTROLLER_GEN) rbac:roleName=manager-role paths="./cmd/...;./controllers/...;./webhook/..." output:rbac:artifacts:config=config/rbac
	go run ./hack/chartgen

.PHONY: chart
chart: ## Regenerate the Helm chart's CRD, RBAC and webhook templates from config/ (the test in charts/ fails when they drift).
	go run ./hack/chartgen

.PHONY: generate
generate: controller-gen ## Generate DeepCopy methods.
	$(CONTROLLER_GEN) object:headerFile="hack/boilerplate.go.txt" paths="./api/..."

.PHONY: fmt
fmt: ## Run go fmt (both modules).
	go fmt ./...
	go -C $(TEST_MODULE) fmt ./...

.PHONY: vet
vet: ## Run go vet (both modules).
	go vet ./...
	go -C $(TEST_MODULE) vet ./...

.PHONY: lint
lint: golangci-lint ## Run golangci-lint on both modules (.golangci.yml: errorlint, importas, revive's exported rules, govet, staticcheck, ...).
	$(GOLANGCI_LINT) run ./...
	cd $(TEST_MODULE) && $(GOLANGCI_LINT) run --config $(CURDIR)/.golangci.yml ./...

.PHONY: test
test: tools vet ## Run every test of both modules: unit, envtest (real kube-apiserver + etcd) and end-to-end. Before a push.
	go test $(GO_TEST_FLAGS) ./...
	go -C $(TEST_MODULE) test $(GO_TEST_FLAGS) ./...

.PHONY: test-unit
test-unit: ## The inner loop, in seconds: go test -short of both modules, every test that needs no control plane, PostgreSQL, tools or built binaries (no tools built).
	go test -short $(UNIT_TEST_FLAGS) ./...
	go -C $(TEST_MODULE) test -short $(UNIT_TEST_FLAGS) ./...

.PHONY: test-envtest
test-envtest: control-plane ## Every test but make test-e2e's: the envtest suites on kube-apiserver + etcd, PostgreSQL, the fault simulation, and the unit tests. After a change to the controllers, webhooks or pkg/lock.
	go test $(GO_TEST_FLAGS) ./...
	go -C $(TEST_MODULE) test $(GO_TEST_FLAGS) $$(comm -23 <(go -C $(TEST_MODULE) list ./... | sort) <(go -C $(TEST_MODULE) list $(E2E_PACKAGES) | sort))

.PHONY: test-e2e
test-e2e: tools ## The end-to-end suites (E2E_PACKAGES of test/): the binaries as a user runs them, install and chart (helm), snapshot restore (etcdutl), chaos, the image. After a change to a command, config/ or the chart.
	go -C $(TEST_MODULE) test $(GO_TEST_FLAGS) $(E2E_PACKAGES)

.PHONY: faults
faults: ## Run the fault simulation's release gate: ROUNDS rounds (default 100,000) of mixed faults.
	go -C $(TEST_MODULE) run ./cmd/lockwarden-faults -rounds $(or $(ROUNDS),100000) $(if $(SEED),-seed $(SEED))

.PHONY: chaos
chaos: control-plane build ## Run the real-process chaos suite for DURATION (default 2m; SEED to fix the fault schedule) and check its history.
	go -C $(TEST_MODULE) build -o $(abspath $(LOCALBIN))/lockwarden-chaos ./cmd/lockwarden-chaos
	$(LOCALBIN)/lockwarden-chaos --assets $(LOCALBIN) --manager $(LOCALBIN)/manager --duration $(or $(DURATION),2m) $(if $(SEED),--seed $(SEED))

.PHONY: verify
verify: manifests generate ## Fail if generated files are out of date.
	git diff --exit-code -- api config charts

##@ Build

.PHONY: build
build: ## Build the manager, the demo and the kubectl plugin (kubectl-lockwarden, and kubectl-lock for compatibility) into bin/.
	mkdir -p $(LOCALBIN)
	go build -ldflags "$(VERSION_LDFLAGS)" -o $(LOCALBIN)/ ./cmd/manager ./cmd/kubectl-lock
	go -C $(TEST_MODULE) build -o $(abspath $(LOCALBIN))/lockwarden-demo ./cmd/lockwarden-demo
	cp $(LOCALBIN)/kubectl-lock $(LOCALBIN)/kubectl-lockwarden

.PHONY: image
image: ## Write the manager's image, one tarball per IMAGE_ARCHS, to dist/ (no Docker needed; see README "Install").
	mkdir -p $(DIST)
	for arch in $(IMAGE_ARCHS); do \
	  CGO_ENABLED=0 GOOS=linux GOARCH=$$arch go build -trimpath -ldflags "-s -w $(VERSION_LDFLAGS)" -o $(DIST)/linux-$$arch/manager ./cmd/manager; \
	  go -C hack/tools/image run . -binary $(DIST)/linux-$$arch/manager -arch $$arch -image $(IMG) -version $(VERSION) -revision $(REVISION) \
	    -out $(DIST)/lockwarden-manager-$(VERSION)-linux-$$arch.tar; \
	done

.PHONY: build-installer
build-installer: ## Write dist/install.yaml: CRDs, RBAC, the Deployment with image $(IMG), Services, webhooks, PodDisruptionBudget.
	mkdir -p $(DIST)
	$(KUBECTL) kustomize config/default | sed 's|image: controller:latest|image: $(IMG)|' > $(DIST)/install.yaml.tmp
	mv $(DIST)/install.yaml.tmp $(DIST)/install.yaml
	@echo "wrote $(DIST)/install.yaml (image $(IMG))"

.PHONY: release-archives
release-archives: ## Write the kubectl plugin's archives for PLUGIN_PLATFORMS and its krew manifest to dist/plugin/.
	hack/release-archives.sh "$(VERSION)" "$(VERSION_LDFLAGS)" "$(DIST)/plugin" $(PLUGIN_PLATFORMS)

.PHONY: controller-gen
controller-gen: ## Build controller-gen into bin/ (once).
	hack/build-tools.sh controller-gen

.PHONY: golangci-lint
golangci-lint: ## Build golangci-lint into bin/ from the Go module proxy (once; make lint does it).
	hack/build-tools.sh golangci-lint

.PHONY: helm
helm: ## Build helm into bin/ from the Go module proxy (once).
	hack/build-tools.sh helm

.PHONY: tools
tools: ## Build the local control plane (with etcdutl), controller-gen and helm into bin/ (once, at the same time; see DEVELOPERS.md).
	hack/build-tools.sh

.PHONY: control-plane
control-plane: ## Build kube-apiserver, etcd and kubectl into bin/ (once), or link them from KUBEBUILDER_ASSETS: all that demo and test-envtest use.
	hack/build-tools.sh control-plane

# demo, playground and bench build the control plane and lockwarden's
# binaries at the same time.
.PHONY: local-binaries
local-binaries:
	$(MAKE) --no-print-directory -j2 control-plane build

.PHONY: demo
demo: local-binaries ## Play the paused-holder story on a local control plane, and stop everything after (WEBHOOK_PORT, default 9443).
	$(LOCALBIN)/lockwarden-demo --assets $(LOCALBIN) --manager $(LOCALBIN)/manager $(if $(WEBHOOK_PORT),--webhook-port $(WEBHOOK_PORT))

.PHONY: playground
playground: local-binaries ## Start a local control plane with the manager for the README walkthrough; Ctrl-C stops it (WEBHOOK_PORT, default 9443).
	$(LOCALBIN)/lockwarden-demo --assets $(LOCALBIN) --manager $(LOCALBIN)/manager --serve $(if $(WEBHOOK_PORT),--webhook-port $(WEBHOOK_PORT))

# Sizes of make bench; empty means the bench's defaults (BENCH_QUICK=1: its quick ones).
BENCH_QUICK ?=
BENCH_HANDOFFS ?=
BENCH_SCALE ?=
BENCH_FLAGS ?=

.PHONY: bench
bench: local-binaries ## Measure lockwarden against etcd's mutex, a Lease lock and leader election on one local control plane; results in results/<time>/ (BENCH_QUICK=1 for ~2-3 min; BENCH_HANDOFFS, BENCH_SCALE, BENCH_FLAGS).
	go -C $(TEST_MODULE) build -o $(abspath $(LOCALBIN))/lockwarden-bench ./cmd/lockwarden-bench
	$(LOCALBIN)/lockwarden-bench --assets $(LOCALBIN) --manager $(LOCALBIN)/manager --out results $(if $(BENCH_QUICK),--quick) $(if $(BENCH_HANDOFFS),--handoffs=$(BENCH_HANDOFFS)) $(if $(BENCH_SCALE),--scale=$(BENCH_SCALE)) $(BENCH_FLAGS)

##@ Test cluster

# The one-node cluster of `make cluster` (hack/cluster/cluster.sh): its
# state directory, and the architecture of the images it loads.
CLUSTER_DIR ?= $(CURDIR)/.tmp/cluster
export CLUSTER_DIR
CLUSTER_ARCH ?= $(shell go env GOARCH)
# The previous release, whose image the real-node suite upgrades from: a
# full commit sha, which a shallow clone can fetch by itself (.ci/run).
PREVIOUS_REF ?= c2a2d62bf9adad9a791580e49bf0fa35964a5195
PREVIOUS_VERSION = $(shell git describe --tags --always $(PREVIOUS_REF) 2>/dev/null)
PREVIOUS_IMG = $(IMAGE_REPO):$(PREVIOUS_VERSION)

.PHONY: previous-ref
previous-ref: ## Print PREVIOUS_REF, the commit of the previous release the upgrade test starts from.
	@echo $(PREVIOUS_REF)

.PHONY: cluster-tools
cluster-tools: tools ## Build the test cluster's node (kubelet, kube-controller-manager, kube-scheduler, kube-proxy, pause; once) and its API server port forwarder into bin/.
	hack/build-tools.sh node
	go -C $(TEST_MODULE) build -o $(abspath $(LOCALBIN))/lockwarden-netns-forward ./cmd/lockwarden-netns-forward

.PHONY: cluster
cluster: cluster-tools ## Start a real one-node cluster (root, Linux, Debian packages; no Docker, no internet) with this tree's image loaded; prints its KUBECONFIG (docs/real-node.md).
	hack/cluster/cluster.sh up
	$(MAKE) --no-print-directory cluster-image
	@echo "export KUBECONFIG=$(CLUSTER_DIR)/kubeconfig   # image $(IMG); make cluster-down removes everything"

.PHONY: cluster-image
cluster-image: ## Build this tree's image (make image, CLUSTER_ARCH) and load it into the test cluster.
	$(MAKE) --no-print-directory image IMAGE_ARCHS=$(CLUSTER_ARCH)
	hack/cluster/cluster.sh load $(DIST)/lockwarden-manager-$(VERSION)-linux-$(CLUSTER_ARCH).tar

.PHONY: cluster-down
cluster-down: ## Stop the test cluster and remove every process, mount, cgroup, network namespace and rule it made.
	hack/cluster/cluster.sh down

.PHONY: test-cluster
test-cluster: ## Run the real-node suite on the cluster of `make cluster`; says why and passes where the cluster cannot run, except in CI. The upgrade test is SKIPPED, with why, when PREVIOUS_REF is not in the clone.
	@if ! hack/cluster/cluster.sh check; then \
	  if [ -n "$$CI" ]; then echo "make test-cluster: CI must run the real-node suite" >&2; exit 1; fi; \
	  echo "make test-cluster: skipped"; exit 0; \
	fi; \
	if [ ! -f "$(CLUSTER_DIR)/kubeconfig" ]; then echo "make test-cluster: no cluster in $(CLUSTER_DIR): run make cluster first" >&2; exit 1; fi; \
	missing=""; \
	$(MAKE) --no-print-directory cluster-image && \
	if git cat-file -e "$(PREVIOUS_REF)^{commit}" 2>/dev/null; then \
	  hack/cluster/previous-image.sh "$(PREVIOUS_REF)" "$(IMAGE_REPO)" "$(CLUSTER_ARCH)"; \
	else \
	  missing="PREVIOUS_REF $(PREVIOUS_REF) is not in this clone (a shallow clone: git fetch --unshallow, or git fetch --depth=1 origin $(PREVIOUS_REF)); the previous release's image cannot be built"; \
	  echo "make test-cluster: $$missing: the upgrade test is skipped" >&2; \
	fi && \
	go -C $(TEST_MODULE) test $(GO_TEST_FLAGS) -v ./cluster/ -args -cluster-dir $(CLUSTER_DIR) -root $(CURDIR) -image $(IMG) -previous-image $(PREVIOUS_IMG) -previous-chart $(DIST)/previous/chart-$(PREVIOUS_VERSION)/lockwarden -previous-missing "$$missing"

.PHONY: run
run: tools install ## Run the manager locally against the cluster in $KUBECONFIG (webhooks on https://localhost:9443).
	$(KUBECTL) apply -k config/local
	go run ./cmd/manager --webhook-cert-secret=lockwarden-system/lockwarden-webhook-server-cert --webhook-dns-name=localhost --metrics-bind-address=127.0.0.1:8080 --health-probe-bind-address=127.0.0.1:8081

##@ Deployment

CRD_WARNING = "WARNING: deleting the CRDs deletes every FenceCounter and the FenceIssuer: fences and epochs restart at 1 and 0, and objects that recorded a higher fence refuse new holders (see README: Uninstall)."

.PHONY: install
install: ## Install the CRDs into the cluster in $KUBECONFIG.
	$(KUBECTL) apply --server-side -k config/crd

.PHONY: uninstall
uninstall: ## Keep the CRDs (fences live in them); DELETE_CRDS=true removes them with every LockGrant, FenceCounter and the FenceIssuer.
ifeq ($(DELETE_CRDS),true)
	@echo $(CRD_WARNING) >&2
	$(KUBECTL) delete --ignore-not-found -k config/crd
else
	@echo "CRDs kept: FenceCounters and the FenceIssuer keep every resource's fence. DELETE_CRDS=true deletes them." >&2
endif

.PHONY: deploy
deploy: ## Deploy everything in config/default (image $IMG) into the cluster in $KUBECONFIG.
	$(KUBECTL) kustomize config/default | sed 's|image: controller:latest|image: $(IMG)|' | $(KUBECTL) apply --server-side -f -

.PHONY: undeploy
undeploy: ## Remove what make deploy installed and the webhooks the manager created, keeping the CRDs unless DELETE_CRDS=true.
	hack/undeploy.sh "$(KUBECTL)" "$(DELETE_CRDS)"
