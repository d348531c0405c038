//go:build tools

// Package tools pins golangci-lint, which runs the linters of `make lint`.
package tools

import _ "github.com/golangci/golangci-lint/v2/cmd/golangci-lint"
