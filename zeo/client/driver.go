package client

import (
	"context"
	"fmt"
	"net/url"

	"github.com/zodbd/zodbd/zodb"
)

// The "zeo" driver of zodb.Open:
//
//	zeo://host:port[?storage=NAME]          TCP
//	zeo:///path/to/unix.sock[?storage=NAME] Unix socket
//
// zodb.OpenOptions.ReadWrite registers read-write; CacheSize sizes the
// client cache (negative: off).
func init() {
	zodb.RegisterDriver("zeo", openURL)
}

func openURL(ctx context.Context, u *url.URL, opt *zodb.OpenOptions) (zodb.Storage, error) {
	network, addr, err := Address(u)
	if err != nil {
		return nil, err
	}
	q := u.Query()
	for k := range q {
		if k != "storage" {
			return nil, fmt.Errorf("zeo client: %s: unknown parameter %q (known: storage)", u.Redacted(), k)
		}
	}
	c, err := Dial(ctx, network, addr, &Options{
		Storage:   q.Get("storage"),
		ReadWrite: opt.ReadWrite,
		CacheSize: opt.CacheSize,
		Logf:      opt.Logf,
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Address returns the network ("tcp" or "unix") and address a zeo:// URL
// names.
func Address(u *url.URL) (network, addr string, err error) {
	switch {
	case u.Host != "" && u.Path != "" && u.Path != "/":
		return "", "", fmt.Errorf("zeo client: %s: want zeo://host:port or zeo:///socket/path", u.Redacted())
	case u.Host != "":
		if u.Port() == "" {
			return "", "", fmt.Errorf("zeo client: %s: no port", u.Redacted())
		}
		return "tcp", u.Host, nil
	case u.Path != "":
		return "unix", u.Path, nil
	}
	return "", "", fmt.Errorf("zeo client: %s: no address", u.Redacted())
}
