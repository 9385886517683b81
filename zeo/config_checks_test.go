package zeo

import (
	"strings"
	"testing"
	"time"
)

// What zeo.conf parsing once ignored or misread where ZConfig (runzeo,
// ZEO 6) refuses or honours it.

const checkZeo = "<zeo>\n  address 127.0.0.1:8100\n</zeo>\n"

func parseText(t *testing.T, text string) (*FileConfig, error) {
	t.Helper()
	return ParseConfig(strings.NewReader(text))
}

// TestConfigNestedSectionsRefused: a section nested where the schema has
// none (a storage inside a <filestorage>, inside a <logfile>, inside
// <ssl>) is refused by ZConfig ("no matching section defined for
// type='filestorage'"); zodbd dropped it silently, and storage 2 was not
// served.
func TestConfigNestedSectionsRefused(t *testing.T) {
	for name, text := range map[string]string{
		"filestorage": checkZeo + `<filestorage 1>
  path /v/Data.fs
  <filestorage 2>
    path /v/Other.fs
  </filestorage>
</filestorage>
`,
		"logfile": checkZeo + `<filestorage 1>
  path /v/Data.fs
</filestorage>
<eventlog>
  <logfile>
    path STDERR
    <filestorage 2>
      path /v/Other.fs
    </filestorage>
  </logfile>
</eventlog>
`,
		"ssl": `<zeo>
  address 127.0.0.1:8100
  <ssl>
    certificate /c.pem
    authenticate /ca.pem
    <filestorage 2>
      path /v/Other.fs
    </filestorage>
  </ssl>
</zeo>
<filestorage 1>
  path /v/Data.fs
</filestorage>
`,
	} {
		cfg, err := parseText(t, text)
		if err == nil {
			t.Errorf("%s: <filestorage 2> nested in <%s> accepted and dropped (storages %d), want an error naming the line", name, name, len(cfg.Storages))
		}
	}
}

// TestConfigRunnerSectionChecked: runzeo checks <runner> against zdaemon's
// schema ("'bogus-key' is not a known key name"; a storage section inside
// it is refused); zodbd accepted anything in <runner> without a word.
func TestConfigRunnerSectionChecked(t *testing.T) {
	for name, runner := range map[string]string{
		"unknown key": "<runner>\n  bogus-key 1\n</runner>\n",
		"storage":     "<runner>\n  <filestorage 2>\n    path /v/Other.fs\n  </filestorage>\n</runner>\n",
	} {
		_, err := parseText(t, checkZeo+runner+"<filestorage 1>\n  path /v/Data.fs\n</filestorage>\n")
		if err == nil {
			t.Errorf("<runner> with a %s: accepted silently, want an error", name)
		}
	}
}

// TestConfigByteSizeOverflow: a byte size past int64 wrapped around: quota
// 17179869185GB (2^64+2^30 bytes; ZConfig keeps it exact, an unlimited
// quota in practice) became a 1 GiB quota, and max-size likewise.
func TestConfigByteSizeOverflow(t *testing.T) {
	cfg, err := parseText(t, checkZeo+"<filestorage 1>\n  path /v/Data.fs\n  quota 17179869185GB\n</filestorage>\n")
	if err == nil && cfg.Storages[0].Quota < 1<<62 {
		t.Errorf("quota 17179869185GB: parsed as %d bytes (wrapped), want an error", cfg.Storages[0].Quota)
	}
	cfg, err = parseText(t, checkZeo+"<filestorage 1>\n  path /v/Data.fs\n</filestorage>\n"+
		"<eventlog>\n  <logfile>\n    path /v/zeo.log\n    max-size 17179869185GB\n    old-files 2\n  </logfile>\n</eventlog>\n")
	if err == nil && cfg.EventLog.Handlers[0].MaxSize < 1<<62 {
		t.Errorf("max-size 17179869185GB: parsed as %d bytes (wrapped), want an error", cfg.EventLog.Handlers[0].MaxSize)
	}
}

// TestConfigTransactionTimeoutOverflow: transaction-timeout 18446744074
// (seconds; ZConfig keeps the integer) overflowed time.Duration and wrapped
// to 0.29 s: every commit that held the lock longer was aborted.
func TestConfigTransactionTimeoutOverflow(t *testing.T) {
	cfg, err := parseText(t, "<zeo>\n  address 127.0.0.1:8100\n  transaction-timeout 18446744074\n</zeo>\n<filestorage 1>\n  path /v/Data.fs\n</filestorage>\n")
	if err == nil && cfg.TransactionTimeout < time.Hour {
		t.Errorf("transaction-timeout 18446744074: parsed as %v (wrapped), want an error", cfg.TransactionTimeout)
	}
}

// TestConfigErrorNamesKeyLine: ZConfig names the line of the bad key
// ("line 6"); zodbd named the line where its section starts.
func TestConfigErrorNamesKeyLine(t *testing.T) {
	for _, tc := range []struct{ text, want string }{
		{checkZeo + "<filestorage 1>\n  path /v/Data.fs\n  quota 10XB\n</filestorage>\n", "line 6"},
		{"<zeo>\n  address 127.0.0.1:8100\n  read-only maybe\n</zeo>\n<filestorage 1>\n  path /v/Data.fs\n</filestorage>\n", "line 3"},
		{checkZeo + "<filestorage 1>\n  path /v/Data.fs\n  pack_gc false\n</filestorage>\n", "line 6"},
	} {
		_, err := parseText(t, tc.text)
		if err == nil || !strings.Contains(err.Error(), tc.want+":") {
			t.Errorf("error %v, want it to name the key's %s", err, tc.want)
		}
	}
}

// TestConfigSubstitutionInValuesOnly: ZConfig substitutes $NAME in values
// and directive arguments only; a section header is taken as written
// (runzeo serves <filestorage $A> as storage "$a"). zodbd substituted in
// section headers and key names too, so the storage got another name.
func TestConfigSubstitutionInValuesOnly(t *testing.T) {
	cfg, err := parseText(t, "%define A main\n"+checkZeo+"<filestorage $A>\n  path /v/Data.fs\n</filestorage>\n")
	if err != nil || cfg.Storages[0].Name != "$a" {
		t.Errorf("<filestorage $A>: %v, storages %+v; runzeo names it \"$a\"", err, cfgStorages(cfg))
	}
}

func cfgStorages(cfg *FileConfig) []FileStorageConfig {
	if cfg == nil {
		return nil
	}
	return cfg.Storages
}

// TestConfigEnvSubstitutionError: $(NAME) is ZConfig's environment
// substitution; zodbd refused it but said "undefined name $", naming
// neither the construct nor the variable.
func TestConfigEnvSubstitutionError(t *testing.T) {
	_, err := parseText(t, checkZeo+"<filestorage 1>\n  path $(HOME)/Data.fs\n</filestorage>\n")
	if err == nil || !strings.Contains(err.Error(), "HOME") {
		t.Errorf("path $(HOME)/Data.fs: %v, want an error naming $(HOME)", err)
	}
}

// TestConfigDefineIllegalName: ZConfig refuses %define of a name that
// $NAME cannot reference ("not a substitution legal name: 'a-b'"); zodbd
// accepted it, and $a-b then meant $a followed by "-b".
func TestConfigDefineIllegalName(t *testing.T) {
	_, err := parseText(t, "%define a-b /v\n"+checkZeo+"<filestorage 1>\n  path /v/Data.fs\n</filestorage>\n")
	if err == nil {
		t.Errorf("%%define a-b: accepted, want an error")
	}
}

// TestConfigAddressChecked: runzeo checks address when it reads the file
// ("99999 is above upper bound (65535) (line 2, in file ...)"); zodbd
// took any text and failed later, at listen, without key or line.
func TestConfigAddressChecked(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:99999", "127.0.0.1:8100 # main port", "127.0.0.1:8100 127.0.0.1:8101"} {
		_, err := parseText(t, "<zeo>\n  address "+addr+"\n</zeo>\n<filestorage 1>\n  path /v/Data.fs\n</filestorage>\n")
		if err == nil {
			t.Errorf("address %s: accepted, want an error naming address and line 2", addr)
		}
	}
}
