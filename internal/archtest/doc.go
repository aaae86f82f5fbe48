// Package archtest holds no code: its tests check that the package table in
// docs/architecture.md lists every package of the module with exactly the
// module imports it has, and that the document names every package that has
// only tests, so the architecture document cannot drift from the code. One
// more checks that scripts/test.sh fuzzes every fuzz target.
package archtest
