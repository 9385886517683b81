// Package resolve resolves write conflicts of ZODB objects natively, for
// the classes behind nearly all conflicts on real sites, as ZODB's
// tryToResolveConflict does with the classes' own _p_resolveConflict; a
// storage server calls it for a store whose serial is stale, under its
// commit lock.
//
// Resolved (the semantics of BTrees 6's C implementation, which is what
// Python's ZODB runs):
//
//   - BTrees.Length.Length: committed + new - old, for int states (any
//     size; bool counts as int).
//   - The buckets and sets of every BTrees family (module
//     BTrees.<XY>BTree, classes <XY>Bucket and <XY>Set, for XY in IF, II,
//     IO, IU, LF, LL, LO, LQ, OI, OL, OO, OQ, OU, QF, QL, QO, QQ, UF, UI,
//     UO, UU and fs): BTrees' three-way merge of the sorted items
//     (bucket_merge, MergeTemplate.c), with its refusals as
//     *RefusedError with BTrees' reason number: 0 a _next that changed, 1
//     to 9 conflicting changes, inserts or deletes of one key, 10 an empty
//     merge, 12 committed or new empty, 13 the first key deleted. The
//     merged bucket keeps old's _next.
//   - <XY>BTree and <XY>TreeSet, when each state is empty (None) or one
//     bucket held inline (((bucket_state,),)); a tree of several buckets
//     is refused with reason 11.
//
// Keys and values are converted and compared as the family's C code does:
// I, L, U, Q as C ints of 32 or 64 bits, signed or unsigned (an int out of
// range, or another type, is ErrUnsupported: BTrees raises TypeError), F
// as a C float, fs as bytes of length 2 and 6, O as Python objects with
// Python 3's comparisons as BTrees' COMPARE makes them: None first and
// equal only to None, otherwise a < b, then a == b (two values are the
// same when a < b is false and a == b true). The Python objects modeled
// are None, bool, int (any size), float (not NaN), str, bytes, tuple and
// list of these, and persistent references, which compare as ZODB's
// PersistentReference: equal for the same oid and database unless weak,
// and otherwise a ValueError. A comparison that raises in Python (an
// ordering between unorderable types, dicts or classes compared, a
// reference compared with another value) gives ErrUnsupported, as does a
// dict anywhere but in a value passed through unchanged.
//
// Everything else is ErrUnsupported, without decoding the state when the
// class is not one of the above: other classes (including the pure-Python
// ...Py classes), records whose three class pickles differ, class
// pickles with __new__ arguments, states holding objects built by calls
// (REDUCE, NEWOBJ, BUILD, INST, OBJ, extension codes: sets, DateTime,
// ...), Python 2 strings that are not ASCII, pickle protocols above 3,
// _next pointers that are not references, persistent ids of forms ZODB
// does not write, and records beyond the bounds below.
//
// Records from clients are untrusted. Decoding is iterative; containers
// nest at most 100 deep; a record's values, expanded as trees (a memo
// entry counted at each use), may be at most 64 times its size (plus
// 4 KiB), and a zlib-compressed record (zc.zlibstorage's ".z" prefix) may
// decompress to at most 64 times its size; a record decodes to at most 4
// values per byte received (compressed or not), and the comparisons of a
// merge visit at most 256 values per byte of the records: beyond these the
// conflict is ErrUnsupported. Memory use and time are proportional to the
// size of the records received.
//
// The result is committed's class pickle, as is, then a state pickle of
// protocol 3 opcodes (not byte-identical to what Python would write, but
// unpickling to the same state), uncompressed.
package resolve
