package app

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"

	"github.com/countersign/countersign/internal/testnats"
)

// TestNATSCredentialFilesLoad: Validate (and so `countersign config check`)
// reads the NATS credentials file and nkey seed file as the client will when
// it connects, instead of finding out at start: a file that opens but holds
// no usable key is an error naming the setting (flag and file key) and the
// file, never quoting it.
func TestNATSCredentialFilesLoad(t *testing.T) {
	dir := t.TempDir()
	user, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := user.Seed()
	account, _ := nkeys.CreateAccount()
	accountSeed, _ := account.Seed()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	creds := func(jwt string, seed []byte) string {
		return fmt.Sprintf("-----BEGIN NATS USER JWT-----\n%s\n------END NATS USER JWT------\n\n"+
			"************************* IMPORTANT *************************\n\n"+
			"-----BEGIN USER NKEY SEED-----\n%s\n------END USER NKEY SEED------\n", jwt, seed)
	}
	const fakeJWT = "eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.eyJzdWIiOiJVIn0.c2ln"
	good := write("good.creds", creds(fakeJWT, seed))
	seedFile := write("user.nk", string(seed)+"\n")
	garbage := write("garbage", "hello\n")

	for _, tc := range []struct {
		name string
		cfg  Config
		want string // "" for no error
	}{
		{"creds", Config{NATSCreds: good}, ""},
		{"nkey", Config{NATSNKey: seedFile}, ""},
		{"creds missing", Config{NATSCreds: filepath.Join(dir, "none.creds")}, "--nats-creds (nats.creds) " + filepath.Join(dir, "none.creds") + ": no such file"},
		{"creds garbage", Config{NATSCreds: garbage}, "--nats-creds (nats.creds) " + garbage + ": no user JWT in it"},
		{"seed file as creds", Config{NATSCreds: seedFile}, "a bare seed file goes in --nats-nkey"},
		{"creds without JWT", Config{NATSCreds: write("nojwt.creds", creds("not-a-jwt", seed))}, "does not hold a JWT"},
		{"creds without seed", Config{NATSCreds: write("noseed.creds", creds(fakeJWT, []byte("none")))}, "no user nkey seed"},
		{"creds with an account seed", Config{NATSCreds: write("acct.creds", creds(fakeJWT, accountSeed))}, "no user nkey seed"},
		{"nkey garbage", Config{NATSNKey: garbage}, "--nats-nkey (nats.nkey) " + garbage + ": no user nkey seed"},
		{"nkey missing", Config{NATSNKey: filepath.Join(dir, "none.nk")}, "--nats-nkey (nats.nkey)"},
		{"account seed as nkey", Config{NATSNKey: write("acct.nk", string(accountSeed))}, "no user nkey seed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Defaults()
			err := tc.cfg.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate: %v, want %q", err, tc.want)
			}
			for _, secret := range [][]byte{seed, accountSeed} {
				if strings.Contains(err.Error(), string(secret)) {
					t.Fatalf("the error quotes a seed: %v", err)
				}
			}
		})
	}
}

// TestNATSDialErrors: a server or worker that cannot connect to its NATS
// says where it tried (without a URL's password) and what to check.
func TestNATSDialErrors(t *testing.T) {
	ns, _ := testnats.StartNKeyUser(t)
	other, _ := nkeys.CreateUser()
	seed, _ := other.Seed()
	seedFile := filepath.Join(t.TempDir(), "other.nk")
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	// A port nothing listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "nats://u:s3cret@" + l.Addr().String()
	l.Close()

	for _, tc := range []struct {
		name string
		cfg  Config
		want []string
	}{
		{"a user the server does not know", Config{NATSURL: ns.ClientURL(), NATSNKey: seedFile},
			[]string{"connect to NATS at " + ns.ClientURL() + ":", "check --nats-creds / nats.creds or --nats-nkey / nats.nkey"}},
		{"no server answers", Config{NATSURL: closed},
			[]string{"connect to NATS at nats://" + l.Addr().String() + ":", "check --nats-url / nats.url"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &App{cfg: tc.cfg, mode: ModeServer, log: slog.New(slog.DiscardHandler)}
			err := a.startNATS(context.Background())
			if a.nc != nil {
				a.nc.Close()
			}
			if err == nil {
				t.Fatal("connected")
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q lacks %q", err, want)
				}
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("error %q shows the URL's password", err)
			}
		})
	}
}

// TestTLSFileErrorsNameFileKeys: a TLS file that does not load is named by
// its flag and by its configuration file key, where it is usually set.
func TestTLSFileErrorsNameFileKeys(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.pem")
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"Temporal CA", Config{TemporalAddress: "t:7233", TemporalTLSCA: missing}, "--temporal-tls-ca (temporal.tls.ca): open " + missing},
		{"Temporal client certificate", Config{TemporalAddress: "t:7233", TemporalTLSCert: missing, TemporalTLSKey: missing},
			"--temporal-tls-cert (temporal.tls.cert) " + missing + " and --temporal-tls-key (temporal.tls.key): open " + missing},
		{"NATS CA", Config{NATSTLSCA: missing}, "--nats-tls-ca (nats.tls.ca): open " + missing},
		{"NATS client certificate", Config{NATSTLSCert: missing, NATSTLSKey: missing}, "--nats-tls-cert (nats.tls.cert) " + missing},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Defaults()
			if err := tc.cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate: %v, want %q", err, tc.want)
			}
		})
	}
}
