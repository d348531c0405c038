// Package e2e runs lockwarden's binaries as a user would, on a local
// control plane built from bin/ (see DEVELOPERS.md).
package e2e
