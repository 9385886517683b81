package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/zodbd/zodbd/neo/internal/msgp"
	"github.com/zodbd/zodbd/neo/link"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/zodb"
	"github.com/zodbd/zodbd/zodb/resolve"
)

// The "neo" and "neos" drivers of zodb.Open, with NEO/py's zodburi syntax:
//
//	neo://CLUSTER@MASTER[,MASTER...][?OPTIONS]
//	neos://CLUSTER@MASTER[,MASTER...][?OPTIONS]
//
// Options (query parameters):
//
//	verify=0          do not check sha1(data) against the storage's checksum
//	read_only=1       identify to the master as a read-only client (also read-only=1)
//	ca=, cert=, key=  PEM files for TLS (NEO's TLS is mutual); neo:// uses
//	                  TLS when all three are given, neos:// always, with
//	                  $NEO_CA, $NEO_CERT, $NEO_KEY for those not given
//
// zodb.OpenOptions.CacheSize sizes the client cache (negative: off).
// Without OpenOptions.ReadWrite the client does not commit (Begin and
// NewOids return zodb.ErrReadOnly; read_only=1 also tells the master);
// with it, it commits, and Txn.Vote
// resolves the conflicts that package zodb/resolve resolves natively
// (BTrees.Length, BTrees buckets), as zodbd's ZEO server does for a ZEO
// client.
func init() {
	zodb.RegisterDriver("neo", openURL)
	zodb.RegisterDriver("neos", openURL)
}

func openURL(ctx context.Context, u *url.URL, opt *zodb.OpenOptions) (zodb.Storage, error) {
	o, err := ParseURL(u)
	if err != nil {
		return nil, err
	}
	o.CacheSize = opt.CacheSize
	o.Logf = opt.Logf
	if !opt.ReadWrite {
		o.NoCommit = true
	} else {
		o.Resolve = resolve.Resolve
	}
	c, err := Dial(ctx, o)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// ParseURL returns the Options a neo:// or neos:// URL names (without
// CacheSize and Logf).
func ParseURL(u *url.URL) (*Options, error) {
	bad := func(format string, args ...interface{}) error {
		return fmt.Errorf("neo client: %s: %s", u.Redacted(), fmt.Sprintf(format, args...))
	}
	if u.Scheme != "neo" && u.Scheme != "neos" {
		return nil, bad("want neo:// or neos://")
	}
	if u.Opaque != "" || (u.Path != "" && u.Path != "/") {
		return nil, bad("want neo://CLUSTER@MASTER[,MASTER...] (no path)")
	}
	if u.Fragment != "" {
		return nil, bad("unexpected fragment")
	}
	o := &Options{}
	if u.User != nil {
		o.Cluster = u.User.Username()
		if _, has := u.User.Password(); has {
			return nil, bad("unexpected password in the cluster name")
		}
	}
	if o.Cluster == "" {
		return nil, bad("no cluster name (want neo://CLUSTER@MASTER)")
	}
	for _, m := range strings.Split(u.Host, ",") {
		if m == "" {
			return nil, bad("empty master address")
		}
		if _, port, err := net.SplitHostPort(m); err != nil || port == "" {
			return nil, bad("master %q: want host:port", m)
		}
		o.Masters = append(o.Masters, m)
	}
	q := u.Query()
	tlsFiles := map[string]string{}
	for k, vs := range q {
		v := vs[len(vs)-1]
		switch k {
		case "verify":
			b, err := parseBool(v)
			if err != nil {
				return nil, bad("verify=%q: %v", v, err)
			}
			o.NoVerify = !b
		case "read_only", "read-only":
			b, err := parseBool(v)
			if err != nil {
				return nil, bad("%s=%q: %v", k, v, err)
			}
			o.ReadOnly = b
		case "ca", "cert", "key":
			tlsFiles[k] = v
		default:
			return nil, bad("unknown parameter %q (known: verify, read_only, ca, cert, key)", k)
		}
	}
	if u.Scheme == "neos" {
		for _, k := range []string{"ca", "cert", "key"} {
			if _, ok := tlsFiles[k]; ok {
				continue
			}
			env := "NEO_" + strings.ToUpper(k)
			v, ok := os.LookupEnv(env)
			if !ok {
				return nil, bad("option %s not given and $%s not set", k, env)
			}
			tlsFiles[k] = v
		}
	}
	switch len(tlsFiles) {
	case 0:
	case 3:
		conf, err := TLSConfig(tlsFiles["ca"], tlsFiles["cert"], tlsFiles["key"])
		if err != nil {
			return nil, bad("%v", err)
		}
		o.TLS = conf
	default:
		return nil, bad("TLS needs all of ca, cert and key")
	}
	return o, nil
}

func parseBool(s string) (bool, error) {
	switch strings.ToLower(s) {
	case "1", "true", "yes", "on", "":
		return true, nil
	case "0", "false", "no", "off":
		return false, nil
	}
	return false, errors.New("want a boolean")
}

// TLSConfig returns the TLS configuration of a NEO client from PEM files:
// mutual TLS 1.2, the peer's certificate checked against the CA without a
// host name check, as NEO/py does (link.TLSConfig).
func TLSConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	return link.TLSConfig(caFile, certFile, keyFile, false)
}

func joinHostPort(a proto.Address) string {
	return net.JoinHostPort(a.Host, strconv.Itoa(int(a.Port)))
}

func floatBits(f float64) uint64 { return math.Float64bits(f) }
func bitsFloat(b uint64) float64 { return math.Float64frombits(b) }

// readOnlyExtra is RequestIdentification's extra map {b"read_only": True}.
func readOnlyExtra() []proto.RawPair {
	return []proto.RawPair{proto.BinPair("read_only", msgp.AppendBool(nil, true))}
}
