package fs1

import (
	"context"
	"fmt"
	"net/url"

	"github.com/zodbd/zodbd/zodb"
)

// The "file" driver of zodb.Open: a plain path or file:///path opens a
// FileStorage, read-only unless OpenOptions.ReadWrite asks for writing.
func init() {
	zodb.RegisterDriver("file", openURL)
}

func openURL(ctx context.Context, u *url.URL, opt *zodb.OpenOptions) (zodb.Storage, error) {
	path := u.Path
	switch u.Host {
	case "", "localhost":
	default:
		// file://relative/path: url.Parse takes the first element as
		// the host; keep it as part of the path.
		path = u.Host + u.Path
	}
	if path == "" {
		return nil, fmt.Errorf("fs1: %s: no path", u)
	}
	fs, err := Open(path, &Options{ReadWrite: opt.ReadWrite, Logf: opt.Logf})
	if err != nil {
		return nil, err
	}
	return fs, nil
}
