// Package fs1tools ports ZODB/py's FileStorage command-line tools to Go,
// with output byte-identical to theirs (ZODB 6.4 on Python 3):
//
//	Dump         ZODB.FileStorage.fsdump.fsdump     (zodbd dump)
//	DumpVerbose  ZODB.FileStorage.fsdump.Dumper     (zodbd dump -v)
//	Tail         ZODB.scripts.fstail                (zodbd tail)
//	Verify       ZODB.scripts.fstest                (zodbd verify)
//
// and the zodbd subcommands dump, tail and verify that run them (RunDump,
// RunTail, RunVerify). The fourth tool, zodbtools' `zodb dump` (zodbd
// zdump), works over any zodb.Storage and lives in package zodbtools.
//
// The tools read the file on their own, with the same checks and in the
// same order as the Python tools, rather than through the fs1 reader: each
// Python tool trusts a different subset of the format (fstail follows the
// redundant lengths backwards without checking them, Dumper trusts every
// length, fstest is a standalone checker), and reproducing their output on a
// damaged file means making the same choices. Python 3 quirks are kept:
// bytes are shown as b'...' and an empty user or description as the repr
// of an empty str where the tools do so, fsdump's offset= is the position of
// a transaction's first data record, and fstail's hash is the sha1 of the
// data records.
//
// Where a ZODB/py tool raises an exception, the Go function returns an
// error after writing what the tool printed before it; the command prints a
// one-line message and exits with status 1. On the test fixtures that is
// fstail on empty.fs (Python: OSError from seeking before the start of the
// file) and on torn.fs (ValueError from a garbage length), and Dumper on
// torn.fs (AssertionError on the cut data record). On torn.fs, Verify
// returns a *VerifyError whose message is exactly fstest's.
//
// Deliberate differences from ZODB/py:
//
//   - The Python 2 magic "FS21" is accepted as well as "FS30" (ZODB/py 6
//     on Python 3 rejects FS21 files in fsdump and fstest).
//   - Python fails with MemoryError or OverflowError when a damaged length
//     makes a tool read a huge number of bytes; where that starts depends on
//     the machine's memory. The Go tools fail from 1 TiB (2^40 bytes) on
//     and, below that, read what the file holds, as Python does when the
//     allocation succeeds.
//   - fstest fails with a Python traceback (OSError or ValueError from seek)
//     when a damaged data length points past the largest file offset the
//     system allows; Verify reports fstest's usual "has data records that
//     extend beyond the transaction record" for it.
//   - Dump fails on a backpointer chain that loops, where fsdump loops
//     forever.
//   - The class fsdump shows for a record whose class pickle is not a GLOBAL
//     (rare: ZODB writes GLOBALs) comes from decoding the pickle with og-rek.
//     ZODB/py imports the classes such a pickle names; here a bare class
//     is shown as if it could be imported ("<class 'mod.name'>."), and a
//     pickle that would call a class gives ".", as an import failure does.
//   - fstail unpickles each transaction's extension and fails if that fails,
//     as ZODB/py does; the unpickler is og-rek rather than zodbpickle, so
//     exotic extensions (persistent references, classes) may be judged
//     differently.
package fs1tools
