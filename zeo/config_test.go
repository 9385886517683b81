package zeo

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseConfig(t *testing.T) {
	cfg, err := ParseConfig(strings.NewReader(`
# a comment
%define VAR /var/zeo
<zeo>
  address 127.0.0.1:8100
  read-only false
  invalidation-queue-size 500
  transaction-timeout 30
  pid-filename $VAR/zeo.pid
  msgpack true
  http-addr 127.0.0.1:9100
  <ssl>
    certificate ${VAR}/cert.pem
    key /k.pem
    authenticate /ca.pem
  </ssl>
</zeo>
<filestorage 1>
  path $VAR/Data.fs
  create yes
  pack-gc false
  quota 10MB
</filestorage>
<filestorage other>
  path /x/Other.fs
  read-only on
</filestorage>
<eventlog>
  level INFO
  <logfile>
    path /var/log/zeo.log
  </logfile>
</eventlog>
`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Address != "127.0.0.1:8100" || cfg.InvalidationQueueSize != 500 || cfg.TransactionTimeout != 30*time.Second ||
		cfg.PidFile != "/var/zeo/zeo.pid" || cfg.Msgpack == nil || !*cfg.Msgpack || cfg.HTTPAddr != "127.0.0.1:9100" ||
		cfg.EventLog == nil || len(cfg.EventLog.Handlers) != 1 || cfg.EventLog.Handlers[0].Path != "/var/log/zeo.log" {
		t.Errorf("zeo section: %+v", cfg)
	}
	if cfg.SSL == nil || cfg.SSL.Certificate != "/var/zeo/cert.pem" || cfg.SSL.Authenticate != "/ca.pem" {
		t.Errorf("ssl: %+v", cfg.SSL)
	}
	if len(cfg.Storages) != 2 {
		t.Fatalf("storages: %+v", cfg.Storages)
	}
	s1, s2 := cfg.Storages[0], cfg.Storages[1]
	if s1.Name != "1" || s1.Path != "/var/zeo/Data.fs" || !s1.Create || s1.PackGC || s1.Quota != 10<<20 {
		t.Errorf("storage 1: %+v", s1)
	}
	if s2.Name != "other" || !s2.ReadOnly || !s2.PackGC {
		t.Errorf("storage other: %+v", s2)
	}
}

// TestParseConfigZlib reads zc.zlibstorage's sections as
// plone.recipe.zeoserver writes them (zlib-storage active or passive), and
// around or inside a <blobstorage>.
func TestParseConfigZlib(t *testing.T) {
	cfg, err := ParseConfig(strings.NewReader(`
%import zc.zlibstorage
<zeo>
  address 127.0.0.1:8100
</zeo>
<zlibstorage 1>
  <filestorage 1>
    path /v/Data.fs
  </filestorage>
</zlibstorage>
<serverzlibstorage passive>
  <blobstorage>
    blob-dir /v/blobs
    <filestorage>
      path /v/P.fs
    </filestorage>
  </blobstorage>
</serverzlibstorage>
<blobstorage stored>
  blob-dir /v/b2
  <zlibstorage>
    compress false
    <filestorage>
      path /v/S.fs
    </filestorage>
  </zlibstorage>
</blobstorage>
<filestorage plain>
  path /v/Plain.fs
</filestorage>
`))
	if err != nil {
		t.Fatal(err)
	}
	want := []FileStorageConfig{
		{Name: "1", Path: "/v/Data.fs", Zlib: "zlibstorage", ZlibCompress: true},
		{Name: "passive", Path: "/v/P.fs", BlobDir: "/v/blobs", Zlib: "serverzlibstorage", ZlibCompress: true},
		{Name: "stored", Path: "/v/S.fs", BlobDir: "/v/b2", Zlib: "zlibstorage"},
		{Name: "plain", Path: "/v/Plain.fs"},
	}
	if len(cfg.Storages) != len(want) {
		t.Fatalf("storages: %+v", cfg.Storages)
	}
	for i, w := range want {
		g := cfg.Storages[i]
		if g.Name != w.Name || g.Path != w.Path || g.BlobDir != w.BlobDir || g.Zlib != w.Zlib || g.ZlibCompress != w.ZlibCompress {
			t.Errorf("storage %d: got %+v, want %+v", i, g, w)
		}
	}
}

func TestParseConfigErrors(t *testing.T) {
	bad := map[string]string{
		"no zeo":                    "<filestorage>\npath /x\n</filestorage>\n",
		"no storage":                "<zeo>\naddress 1\n</zeo>\n",
		"import":                    "%import ZODB.tests\n<zeo>\naddress 1\n</zeo>\n",
		"relstorage":                "<zeo>\naddress 1\n</zeo>\n<relstorage>\n</relstorage>\n",
		"unclosed":                  "<zeo>\naddress 1\n",
		"mismatch":                  "<zeo>\naddress 1\n</filestorage>\n",
		"bad bool":                  "<zeo>\naddress 1\nread-only maybe\n</zeo>\n<filestorage>\npath /x\n</filestorage>\n",
		"unknown key":               "<zeo>\naddress 1\ncolour blue\n</zeo>\n<filestorage>\npath /x\n</filestorage>\n",
		"two unnamed":               "<zeo>\naddress 1\n</zeo>\n<filestorage>\npath /x\n</filestorage>\n<filestorage>\npath /y\n</filestorage>\n",
		"undefined var":             "<zeo>\naddress $NOPE\n</zeo>\n<filestorage>\npath /x\n</filestorage>\n",
		"password fn":               "<zeo>\naddress 1\n<ssl>\ncertificate /c\npassword-function a.b\n</ssl>\n</zeo>\n<filestorage>\npath /x\n</filestorage>\n",
		"no path":                   "<zeo>\naddress 1\n</zeo>\n<filestorage>\n</filestorage>\n",
		"zlib without its import":   "<zeo>\naddress 1\n</zeo>\n<zlibstorage>\n<filestorage>\npath /x\n</filestorage>\n</zlibstorage>\n",
		"zlib in zlib":              "%import zc.zlibstorage\n<zeo>\naddress 1\n</zeo>\n<zlibstorage>\n<serverzlibstorage>\n<filestorage>\npath /x\n</filestorage>\n</serverzlibstorage>\n</zlibstorage>\n",
		"zlib around nothing":       "%import zc.zlibstorage\n<zeo>\naddress 1\n</zeo>\n<zlibstorage>\n</zlibstorage>\n",
		"zlib bad compress":         "%import zc.zlibstorage\n<zeo>\naddress 1\n</zeo>\n<zlibstorage>\ncompress often\n<filestorage>\npath /x\n</filestorage>\n</zlibstorage>\n",
		"zlib around mapping":       "%import zc.zlibstorage\n<zeo>\naddress 1\n</zeo>\n<zlibstorage>\n<mappingstorage>\n</mappingstorage>\n</zlibstorage>\n",
		"two blob dirs":             "<zeo>\naddress 1\n</zeo>\n<blobstorage>\nblob-dir /a\n<filestorage>\npath /x\nblob-dir /b\n</filestorage>\n</blobstorage>\n",
		"negative invalidation-age": "<zeo>\naddress 1\ninvalidation-age -1\n</zeo>\n<filestorage>\npath /x\n</filestorage>\n",
		"NaN invalidation-age":      "<zeo>\naddress 1\ninvalidation-age nan\n</zeo>\n<filestorage>\npath /x\n</filestorage>\n",
		"import with more":          "%import zc.zlibstorage os\n<zeo>\naddress 1\n</zeo>\n<filestorage>\npath /x\n</filestorage>\n",
		"quota 0":                   "<zeo>\naddress 1\n</zeo>\n<filestorage>\npath /x\nquota 0\n</filestorage>\n",
		"http-addr without port":    "<zeo>\naddress 1\nhttp-addr localhost\n</zeo>\n<filestorage>\npath /x\n</filestorage>\n",
		"http-addr bad port":        "<zeo>\naddress 1\nhttp-addr :99999\n</zeo>\n<filestorage>\npath /x\n</filestorage>\n",
	}
	for name, text := range bad {
		if cfg, err := ParseConfig(strings.NewReader(text)); err == nil {
			t.Errorf("%s: parsed as %+v, want an error", name, cfg)
		}
	}
}

// FuzzParseConfig parses arbitrary configuration text: no panic, and what
// parses has an address and storages with distinct names, each with a
// path and a known zlib mode.
func FuzzParseConfig(f *testing.F) {
	f.Add("<zeo>\naddress 1\n</zeo>\n<filestorage>\npath /x\n</filestorage>\n")
	f.Add("%import zc.zlibstorage\n%define D /v\n<zeo>\naddress 127.0.0.1:1\n<ssl>\ncertificate $D/c\n</ssl>\n</zeo>\n" +
		"<blobstorage b>\nblob-dir ${D}/b\n<zlibstorage>\ncompress false\n<filestorage>\npath /x\n</filestorage>\n</zlibstorage>\n</blobstorage>\n" +
		"<serverzlibstorage s>\n<filestorage>\npath /y\n</filestorage>\n</serverzlibstorage>\n<eventlog>\n<logfile>\npath /l\n</logfile>\n</eventlog>\n")
	f.Fuzz(func(t *testing.T, text string) {
		cfg, err := ParseConfig(strings.NewReader(text))
		if err != nil {
			return
		}
		if cfg.Address == "" || len(cfg.Storages) == 0 {
			t.Fatalf("parsed without an address or a storage: %+v", cfg)
		}
		names := map[string]bool{}
		for _, s := range cfg.Storages {
			if s.Name == "" || names[s.Name] || s.Path == "" {
				t.Fatalf("storage %+v (names so far %v)", s, names)
			}
			names[s.Name] = true
			switch s.Zlib {
			case "", "zlibstorage", "serverzlibstorage":
			default:
				t.Fatalf("storage %+v: zlib mode %q", s, s.Zlib)
			}
			if s.ZlibCompress && s.Zlib == "" {
				t.Fatalf("storage %+v: compress without a zlib storage section", s)
			}
		}
	})
}

// TestInvalidationAgeLimit: an invalidation-age too big for a
// time.Duration is its maximum, not an overflow to a negative duration
// (which would turn the feature off).
func TestInvalidationAgeLimit(t *testing.T) {
	for _, v := range []string{"1e10", "1e300", "inf"} {
		f, err := ParseInvalidationAge(v)
		if err != nil {
			t.Fatalf("%s: %v", v, err)
		}
		if d := time.Duration(f * float64(time.Second)); d < 200*365*24*time.Hour {
			t.Errorf("%s: %v, want about 292 years", v, d)
		}
	}
}

// TestConfigExpandUser: ZConfig's existing-dirpath (the datatype of
// <filestorage>'s path and blob-dir, pid-filename, <ssl>'s certificate
// and key) applies os.path.expanduser: runzeo served $HOME/Data.fs for
// `path ~/Data.fs`, zodbd a file under a directory named "~". Log paths
// and <blobstorage>'s blob-dir are taken as they are, as ZConfig does.
func TestConfigExpandUser(t *testing.T) {
	t.Setenv("HOME", "/home/op/")
	for in, want := range map[string]string{
		"~/Data.fs": "/home/op/Data.fs", "~": "/home/op", "a/~/b": "a/~/b",
		"~no-such-user-zodbd/x": "~no-such-user-zodbd/x", "/abs": "/abs",
	} {
		if got := expandUser(in); got != want {
			t.Errorf("expandUser(%q) = %q, want %q", in, got, want)
		}
	}
	dir := t.TempDir()
	conf := filepath.Join(dir, "zeo.conf")
	text := "<zeo>\naddress 127.0.0.1:0\npid-filename ~/zeo.pid\n<ssl>\ncertificate ~/c.pem\nkey ~/k.pem\nauthenticate ~/ca.pem\n</ssl>\n</zeo>\n" +
		"<filestorage 1>\npath ~/Data.fs\nblob-dir ~/blobs\n</filestorage>\n" +
		"<blobstorage 2>\nblob-dir ~/b2\n<filestorage>\npath ~/2.fs\n</filestorage>\n</blobstorage>\n"
	if err := os.WriteFile(conf, []byte(text), 0o666); err != nil {
		t.Fatal(err)
	}
	fc, err := ParseConfigFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	got := []string{fc.PidFile, fc.SSL.Certificate, fc.SSL.Key, fc.SSL.Authenticate,
		fc.Storages[0].Path, fc.Storages[0].BlobDir, fc.Storages[1].Path, fc.Storages[1].BlobDir}
	want := []string{"/home/op/zeo.pid", "/home/op/c.pem", "/home/op/k.pem", "~/ca.pem",
		"/home/op/Data.fs", "/home/op/blobs", "/home/op/2.fs", "~/b2"}
	if !slices.Equal(got, want) {
		t.Errorf("zeo.conf paths: got %q, want %q", got, want)
	}
}
