package client

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/zodbd/zodbd/zodb"
)

// The "zeo" and "zeos" drivers of zodb.Open:
//
//	zeo://host:port[?storage=NAME]          TCP
//	zeo:///path/to/unix.sock[?storage=NAME] Unix socket
//	zeos://host:port[?storage=NAME&TLS...]  TCP with TLS
//
// The TLS parameters of zeos:// are those of TLSOptions, named like the
// keys of ZEO's client <ssl> section:
//
//	ca=PATH               CA file or directory the server's certificate must
//	                      chain to (authenticate); default: the system's
//	cert=PATH, key=PATH   the client's certificate and key (certificate, key);
//	                      key defaults to cert
//	server_hostname=NAME  the name to check in the server's certificate
//	                      (server-hostname); default: the URL's host
//	check_hostname=0      check the chain, not the name (check-hostname)
//
// zodb.OpenOptions.ReadWrite registers read-write; CacheSize sizes the
// client cache (negative: off).
func init() {
	zodb.RegisterDriver("zeo", openURL)
	zodb.RegisterDriver("zeos", openURL)
}

func openURL(ctx context.Context, u *url.URL, opt *zodb.OpenOptions) (zodb.Storage, error) {
	network, addr, o, err := ParseURL(u)
	if err != nil {
		return nil, err
	}
	o.ReadWrite = opt.ReadWrite
	o.CacheSize = opt.CacheSize
	o.Logf = opt.Logf
	c, err := Dial(ctx, network, addr, o)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// ParseURL returns the network, address and Options (Storage and TLS) that
// a zeo:// or zeos:// URL names.
func ParseURL(u *url.URL) (network, addr string, o *Options, err error) {
	bad := func(format string, args ...interface{}) error {
		return fmt.Errorf("zeo client: %s: %s", u.Redacted(), fmt.Sprintf(format, args...))
	}
	if u.Scheme != "zeo" && u.Scheme != "zeos" {
		return "", "", nil, bad("want zeo:// or zeos://")
	}
	if network, addr, err = Address(u); err != nil {
		return "", "", nil, err
	}
	o = &Options{}
	var t TLSOptions
	known := "storage"
	if u.Scheme == "zeos" {
		known = "storage, ca, cert, key, server_hostname, check_hostname"
	}
	for k, vs := range u.Query() {
		v := vs[len(vs)-1]
		tlsParam := true
		switch k {
		case "storage":
			o.Storage, tlsParam = v, false
		case "ca":
			t.CA = v
		case "cert":
			t.Cert = v
		case "key":
			t.Key = v
		case "server_hostname", "server-hostname":
			t.ServerName = v
		case "check_hostname", "check-hostname":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return "", "", nil, bad("%s=%q: want a boolean (0 or 1)", k, v)
			}
			t.NoCheckHostname = !b
		default:
			return "", "", nil, bad("unknown parameter %q (known: %s)", k, known)
		}
		if tlsParam && u.Scheme != "zeos" {
			return "", "", nil, bad("parameter %q is for TLS: use zeos://", k)
		}
	}
	if u.Scheme == "zeos" {
		if network != "tcp" {
			return "", "", nil, bad("zeos:// needs host:port")
		}
		if o.TLS, err = t.Config(); err != nil {
			return "", "", nil, bad("%s", strings.TrimPrefix(err.Error(), "zeo client: "))
		}
	}
	return network, addr, o, nil
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
