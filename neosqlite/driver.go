package neosqlite

import (
	"context"
	"fmt"
	"net/url"

	"github.com/zodbd/zodbd/zodb"
)

// The "sqlite" driver of zodb.Open: sqlite:///abs/path/storage.sqlite (or
// sqlite://relative/path) opens the database of a NEO/py storage node
// read-only. The result never implements zodb.WriteStorage, whatever
// OpenOptions.ReadWrite says.
func init() {
	zodb.RegisterDriver("sqlite", openURL)
}

func openURL(ctx context.Context, u *url.URL, opt *zodb.OpenOptions) (zodb.Storage, error) {
	path := u.Path
	switch {
	case u.Opaque != "":
		// sqlite:path (no "//").
		path = u.Opaque
	case u.Host == "" || u.Host == "localhost":
	default:
		// sqlite://relative/path: url.Parse takes the first element
		// as the host; keep it as part of the path.
		path = u.Host + u.Path
	}
	if path == "" {
		return nil, fmt.Errorf("neosqlite: %s: no path", u)
	}
	db, err := Open(ctx, path)
	if err != nil {
		return nil, err
	}
	return db, nil
}
