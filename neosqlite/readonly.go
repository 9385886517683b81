package neosqlite

// ReadOnly tells whether db was opened without its write side (Open, not
// OpenWriter).
//
// (It belongs in write.go, beside the field it reads; it is here so that
// the NEO node's branch does not edit that file.)
func (db *DB) ReadOnly() bool { return db.w == nil }
