// Package archtest holds no code: its test checks that the package table in
// docs/architecture.md lists every package of the module with exactly the
// module imports it has, so the architecture document cannot drift from the
// code.
package archtest
