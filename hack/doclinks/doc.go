// Package doclinks holds the check that keeps the project's documentation
// navigable: every relative link in README.md, DEVELOPERS.md, CHANGELOG.md
// and docs/*.md names a file or directory that exists, and every #anchor
// names a heading of the Markdown file it points into (GitHub's heading
// anchors). Run it with `go test ./hack/doclinks`; it has no code of its own
// beyond the test.
package doclinks
