package neosqlite

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	sqlite3 "modernc.org/sqlite/lib"
)

// CreateOptions are the choices NEO/py's storage offers for a new database.
type CreateOptions struct {
	// Name, when not "", is stored as config "name", as NEO/py's node
	// stores its cluster name at its first start (before it joins).
	Name string
	// Dedup adds NEO/py's --dedup index (unique data rows by hash and
	// compression, _data_i1), with which identical data is stored once.
	Dedup bool
}

// Create makes path a new, empty NEO/py storage database: the schema
// NEO/py's SQLite manager creates at its first start (tables config, pt,
// pack, trans, obj, data, ttrans, tobj and their indexes, with the same
// statement text, so that `sqlite3 .schema` prints the same), config
// "version" 4 and no partition table, in the rollback journal mode NEO/py
// leaves it in. Either node then starts on it, joins a new cluster and is
// given a node id and a partition table (SetNID, SetPartitionTable).
//
// The file is created if it does not exist; an existing empty file (0
// bytes) is used. Create holds NEO/py's storage lock while it writes, and
// fails with an error wrapping fs.ErrExist for a file that is not empty,
// and with ErrLocked if a node holds the lock.
func Create(path string, opt CreateOptions) error {
	fail := func(err error) error { return &Error{Path: path, Err: err} }
	abs, err := filepath.Abs(path)
	if err != nil {
		return fail(err)
	}
	f, err := os.OpenFile(abs, os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		return fail(err)
	}
	fi, err := f.Stat()
	f.Close()
	if err != nil {
		return fail(err)
	}
	if !fi.Mode().IsRegular() {
		return fail(fmt.Errorf("not a regular file"))
	}
	lock, err := lockStorage(fi)
	switch {
	case errors.Is(err, errors.ErrUnsupported):
	case err != nil:
		return fail(err)
	default:
		defer lock.Close()
	}
	// Under the lock: nobody else is creating it.
	if fi, err = os.Stat(abs); err != nil {
		return fail(err)
	}
	c, err := openRaw(dsnRW(abs), sqlite3.SQLITE_OPEN_READWRITE, busyTimeoutMS)
	if err != nil {
		return fail(err)
	}
	if fi.Size() != 0 || exists(abs+"-journal") || exists(abs+"-wal") {
		// A file left by a crash during a create (SQLite rolls its
		// schema transaction back as it reads it) has no table: the
		// schema is created again, as NEO/py's CREATE TABLE IF NOT
		// EXISTS does.
		n, err := c.queryText("SELECT count(*) FROM sqlite_master")
		if err != nil || n != "0" {
			c.close()
			if err == nil {
				err = fmt.Errorf("create: %w (not empty)", fs.ErrExist)
			}
			return fail(err)
		}
	}
	err = c.createSchema(opt)
	c.close()
	if err != nil {
		return fail(fmt.Errorf("create: %w", err))
	}
	return nil
}

// createSchema writes the schema, in one transaction.
func (c *rawConn) createSchema(opt CreateOptions) error {
	stmts := []string{"BEGIN IMMEDIATE"}
	for _, t := range schema {
		stmts = append(stmts, "CREATE TABLE "+t.name+" ("+t.body)
	}
	stmts = append(stmts,
		"CREATE INDEX _obj_i1 ON obj(partition, tid, oid)",
		"CREATE INDEX _obj_i2 ON obj(data_id)")
	if opt.Dedup {
		stmts = append(stmts, "CREATE UNIQUE INDEX _data_i1 ON data(hash, compression)")
	}
	stmts = append(stmts, "INSERT INTO config VALUES ('version', '"+SchemaVersion+"')")
	for _, q := range stmts {
		if err := c.execSQL(q); err != nil {
			c.execSQL("ROLLBACK")
			return err
		}
	}
	if opt.Name != "" {
		st, err := c.prepare("INSERT INTO config VALUES ('name', ?)")
		if err != nil {
			c.execSQL("ROLLBACK")
			return err
		}
		err = c.bindText(st, 1, opt.Name)
		if err == nil {
			err = c.exec(st, "config name")
		}
		sqlite3.Xsqlite3_finalize(c.tls, st)
		if err != nil {
			c.execSQL("ROLLBACK")
			return err
		}
	}
	return c.execSQL("COMMIT")
}

// schema is NEO/py's SQLite schema, version 4, in the order its manager
// creates the tables. SQLite keeps the text of each CREATE statement
// (sqlite_master.sql), so the bodies are written with the same layout as
// NEO/py's, whitespace and comments included: the two files' schemas are
// then identical.
var schema = []struct{ name, body string }{
	{"config", `
                 name TEXT NOT NULL PRIMARY KEY,
                 value TEXT) WITHOUT ROWID
            `},
	{"pt", `
                 partition INTEGER NOT NULL,
                 nid INTEGER NOT NULL,
                 tid INTEGER NOT NULL,
                 pack INTEGER,
                 PRIMARY KEY (partition, nid)
            ) WITHOUT ROWID
            `},
	{"pack", `
                 tid INTEGER PRIMARY KEY,
                 approved BOOLEAN, -- NULL if not signed
                 partial BOOLEAN NOT NULL,
                 oids BLOB, -- same format as trans.oids
                 pack_tid INTEGER)
            `},
	{"trans", `
                 partition INTEGER NOT NULL,
                 tid INTEGER NOT NULL,
                 packed BOOLEAN NOT NULL,
                 oids BLOB NOT NULL,
                 user BLOB NOT NULL,
                 description BLOB NOT NULL,
                 ext BLOB NOT NULL,
                 ttid INTEGER NOT NULL,
                 PRIMARY KEY (partition, tid)
            ) WITHOUT ROWID
            `},
	{"obj", `
                 partition INTEGER NOT NULL,
                 oid INTEGER NOT NULL,
                 tid INTEGER NOT NULL,
                 data_id INTEGER,
                 value_tid INTEGER,
                 PRIMARY KEY (partition, oid, tid)
            ) WITHOUT ROWID
            `},
	{"data", `
                 id INTEGER PRIMARY KEY,
                 hash BLOB NOT NULL,
                 compression INTEGER NOT NULL,
                 value BLOB NOT NULL)
            `},
	{"ttrans", `
                 partition INTEGER NOT NULL,
                 tid INTEGER,
                 packed BOOLEAN NOT NULL,
                 oids BLOB NOT NULL,
                 user BLOB NOT NULL,
                 description BLOB NOT NULL,
                 ext BLOB NOT NULL,
                 ttid INTEGER NOT NULL)
            `},
	{"tobj", `
                 partition INTEGER NOT NULL,
                 oid INTEGER NOT NULL,
                 tid INTEGER NOT NULL,
                 data_id INTEGER,
                 value_tid INTEGER,
                 PRIMARY KEY (tid, oid)
            ) WITHOUT ROWID
            `},
}
