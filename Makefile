# lockwarden: fenced distributed locks for Kubernetes.
#
# Two commands do all set-up on a fresh machine:
#   make demo   the seed story on a local control plane (etcd + kube-apiserver)
#   make test   the whole test suite (unit, envtest, end-to-end)

SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec

LOCALBIN ?= $(CURDIR)/bin
KUBECTL ?= $(LOCALBIN)/kubectl
CONTROLLER_GEN ?= $(LOCALBIN)/controller-gen
IMG ?= controller:latest
# envtest finds kube-apiserver and etcd here (built by hack/build-tools.sh).
export KUBEBUILDER_ASSETS ?= $(LOCALBIN)
GO_TEST_FLAGS ?= -count=1 -timeout 25m

.PHONY: all
all: build

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "\nUsage:\n  make \033[36m<target>\033[0m\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-15s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) } ' $(MAKEFILE_LIST)

##@ Development

.PHONY: manifests
manifests: tools ## Generate CRDs and RBAC from the Go markers (webhook manifests are written by hand).
	$(CONTROLLER_GEN) crd paths="./api/..." output:crd:artifacts:config=config/crd/bases
	$(CONTROLLER_GEN) rbac:roleName=manager-role paths="./cmd/...;./controllers/...;./webhook/..." output:rbac:artifacts:config=config/rbac

.PHONY: generate
generate: tools ## Generate DeepCopy methods.
	$(CONTROLLER_GEN) object:headerFile="hack/boilerplate.go.txt" paths="./api/..."

.PHONY: fmt
fmt: ## Run go fmt.
	go fmt ./...

.PHONY: vet
vet: ## Run go vet.
	go vet ./...

.PHONY: test
test: tools vet ## Run every test: unit, envtest (real kube-apiserver + etcd) and end-to-end.
	go test $(GO_TEST_FLAGS) ./...

.PHONY: faults
faults: ## Run the fault simulation's release gate: ROUNDS rounds (default 100,000) of mixed faults.
	go run ./cmd/lockwarden-faults -rounds $(or $(ROUNDS),100000) $(if $(SEED),-seed $(SEED))

.PHONY: chaos
chaos: tools build ## Run the real-process chaos suite for DURATION (default 2m; SEED to fix the fault schedule) and check its history.
	go build -o $(LOCALBIN)/lockwarden-chaos ./cmd/lockwarden-chaos
	$(LOCALBIN)/lockwarden-chaos --assets $(LOCALBIN) --manager $(LOCALBIN)/manager --duration $(or $(DURATION),2m) $(if $(SEED),--seed $(SEED))

.PHONY: verify
verify: manifests generate ## Fail if generated files are out of date.
	git diff --exit-code -- api config

##@ Build

.PHONY: build
build: ## Build the manager, the demo and the kubectl lock plugin into bin/.
	go build -o $(LOCALBIN)/manager ./cmd/manager
	go build -o $(LOCALBIN)/lockwarden-demo ./cmd/lockwarden-demo
	go build -o $(LOCALBIN)/kubectl-lock ./cmd/kubectl-lock

.PHONY: tools
tools: ## Build the local control plane and controller-gen into bin/ (once; see DEVELOPERS.md).
	hack/build-tools.sh

.PHONY: demo
demo: tools build ## Play the paused-holder story on a local control plane, and stop everything after.
	$(LOCALBIN)/lockwarden-demo --assets $(LOCALBIN) --manager $(LOCALBIN)/manager

.PHONY: playground
playground: tools build ## Start a local control plane with the manager for the README walkthrough; Ctrl-C stops it.
	$(LOCALBIN)/lockwarden-demo --assets $(LOCALBIN) --manager $(LOCALBIN)/manager --serve

# Sizes of make bench; empty means the bench's defaults (BENCH_QUICK=1: its quick ones).
BENCH_QUICK ?=
BENCH_HANDOFFS ?=
BENCH_SCALE ?=
BENCH_FLAGS ?=

.PHONY: bench
bench: tools build ## Measure lockwarden against etcd's mutex, a Lease lock and leader election on one local control plane; results in results/<time>/ (BENCH_QUICK=1 for ~2-3 min; BENCH_HANDOFFS, BENCH_SCALE, BENCH_FLAGS).
	go build -o $(LOCALBIN)/lockwarden-bench ./cmd/lockwarden-bench
	$(LOCALBIN)/lockwarden-bench --assets $(LOCALBIN) --manager $(LOCALBIN)/manager --out results $(if $(BENCH_QUICK),--quick) $(if $(BENCH_HANDOFFS),--handoffs=$(BENCH_HANDOFFS)) $(if $(BENCH_SCALE),--scale=$(BENCH_SCALE)) $(BENCH_FLAGS)

.PHONY: run
run: tools install ## Run the manager locally against the cluster in $KUBECONFIG (webhooks on https://localhost:9443).
	$(KUBECTL) apply -k config/local
	go run ./cmd/manager --webhook-cert-secret=lockwarden-system/lockwarden-webhook-server-cert --webhook-dns-name=localhost --metrics-bind-address=127.0.0.1:8080 --health-probe-bind-address=127.0.0.1:8081

##@ Deployment

.PHONY: install
install: tools ## Install the CRDs into the cluster in $KUBECONFIG.
	$(KUBECTL) apply --server-side -k config/crd

.PHONY: uninstall
uninstall: tools ## Remove the CRDs (and every LockGrant and FenceCounter) from the cluster.
	$(KUBECTL) delete --ignore-not-found -k config/crd

.PHONY: deploy
deploy: tools ## Deploy the manager (image $IMG) into the cluster in $KUBECONFIG.
	$(KUBECTL) kustomize config/default | sed 's|image: controller:latest|image: $(IMG)|' | $(KUBECTL) apply --server-side -f -

.PHONY: undeploy
undeploy: tools ## Remove everything make deploy installed.
	$(KUBECTL) kustomize config/default | $(KUBECTL) delete --ignore-not-found -f -
