package sqlitebackend

// ReadOnly implements ReadOnlyBackend: a database wrapped by NewSQLite
// from neosqlite.Open is served read-only; OpenSQLite's takes commits.
//
// (It belongs in sqlitebackend.go; it is here so that the node's branch
// does not edit the backend's files.)
func (b *SQLiteBackend) ReadOnly() bool { return b.db.ReadOnly() }
