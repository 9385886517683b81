// Package storagetest holds the storage conformance suite and helpers for
// tests that read a ZODB storage through the zodb interfaces.
//
// Run is the suite that every zodb.Storage implementation runs from a
// TestConformance beside it: reads of a fixture database checked against
// what ZODB/py (or NEO/py) wrote of it (Reference, FS1Reference,
// NEOReference), commits on a new database, closing. What a storage can do
// is probed through the interfaces it implements; what it cannot do is
// skipped with the reason, and known gaps are named in Factory.Known.
// Walk and Records read iterations for other tests.
//
// It imports only package zodb, internal/datasets (for the repository's
// root) and the standard library, so that the tests of every other
// package, fs1 and zodb/serialize included, can use it.
package storagetest
