// Package archtest holds no code: its test checks that the packages of the
// module import each other as docs/ARCHITECTURE.md's layering table says.
//
// The table is the contract. Each row names one or more packages (in
// backquotes, relative to the module) and, in its last column, the module
// packages they may import ("stdlib" for none, "all of the above" for any
// package of an earlier row). The test runs `go list` over the module and
// fails when
//
//   - a package of the module has no row, or a row names no package;
//   - a package imports (in its non-test files) a module package its row
//     does not list, or one listed in a later row (the layering is one-way);
//   - a protocol package imports the other protocol's (no `zeo` package
//     imports a `neo/...` one, and back), whatever the table says;
//   - the release binary (cmd/zodbd) links a package whose row says
//     "tests only" or "benchmarks only".
package archtest
