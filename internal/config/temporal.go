package config

import "go.yaml.in/yaml/v3"

// Temporal is the temporal section: the Temporal cluster of `server` and
// `worker` (and of `dev` instead of the embedded one).
//
//	temporal:
//	  address: my-ns.a2b3c.tmprl.cloud:7233   # --temporal-address
//	  namespace: my-ns.a2b3c                 # --temporal-namespace
//	  api_key: ${file:/run/secrets/temporal-api-key}   # Temporal Cloud; implies TLS
//	  tls:
//	    enabled: true                        # TLS with the system roots; implied by any other tls key
//	    ca: /etc/countersign/temporal-ca.pem # trust only this CA bundle
//	    cert: /etc/countersign/client.pem    # client certificate (mutual TLS), with key
//	    key: /etc/countersign/client.key
//	    server_name: temporal.internal       # the name the server certificate must carry
type Temporal struct {
	Address   string
	Namespace string
	// APIKey is a secret: resolved from ${NAME} or ${file:…}, redacted when
	// printed.
	APIKey string
	TLS    TemporalTLS
}

// TemporalTLS is temporal.tls. Paths are absolute (relative ones are taken
// from the configuration file's directory).
type TemporalTLS struct {
	Enabled    bool
	CA         string
	Cert       string
	Key        string
	ServerName string
}

var (
	temporalFields    = []string{"address", "namespace", "api_key", "tls"}
	temporalTLSFields = []string{"enabled", "ca", "cert", "key", "server_name"}
)

func (d *decoder) temporal(f *File, v *yaml.Node) {
	t := &f.Temporal
	d.section(v, "temporal", temporalFields, func(key, sub string, _, v *yaml.Node) {
		switch key {
		case "address":
			t.Address = d.hostPort(v, sub, "temporal.example.com:7233")
		case "namespace":
			t.Namespace = d.nonEmpty(v, sub)
		case "api_key":
			t.APIKey = d.secret(v, sub)
		case "tls":
			d.temporalTLS(&t.TLS, v, sub)
		}
	})
}

func (d *decoder) temporalTLS(t *TemporalTLS, v *yaml.Node, field string) {
	var certLine, keyLine int
	d.section(v, field, temporalTLSFields, func(key, sub string, k, v *yaml.Node) {
		switch key {
		case "enabled":
			t.Enabled, _ = d.boolean(v, sub)
		case "ca":
			t.CA = d.filePath(v, sub)
		case "cert":
			certLine = k.Line
			t.Cert = d.filePath(v, sub)
		case "key":
			keyLine = k.Line
			t.Key = d.filePath(v, sub)
		case "server_name":
			t.ServerName = d.nonEmpty(v, sub)
		}
	})
	d.pair(field, "cert", certLine, "key", keyLine)
}

// pair reports one of two keys that go together (a client certificate and
// its key) given without the other.
func (d *decoder) pair(field, a string, aLine int, b string, bLine int) {
	switch {
	case aLine != 0 && bLine == 0:
		d.addf(aLine, join(field, a), "needs %s beside it", join(field, b))
	case bLine != 0 && aLine == 0:
		d.addf(bLine, join(field, b), "needs %s beside it", join(field, a))
	}
}

type temporalView struct {
	Address   string           `yaml:"address,omitempty"`
	Namespace string           `yaml:"namespace,omitempty"`
	APIKey    string           `yaml:"api_key,omitempty"`
	TLS       *temporalTLSView `yaml:"tls,omitempty"`
}

type temporalTLSView struct {
	Enabled    bool   `yaml:"enabled"`
	CA         string `yaml:"ca,omitempty"`
	Cert       string `yaml:"cert,omitempty"`
	Key        string `yaml:"key,omitempty"`
	ServerName string `yaml:"server_name,omitempty"`
}

// view is the printed form of a redacted section; nil when it is empty.
func (t Temporal) view() *temporalView {
	if t == (Temporal{}) {
		return nil
	}
	v := &temporalView{Address: t.Address, Namespace: t.Namespace, APIKey: t.APIKey}
	if t.TLS != (TemporalTLS{}) {
		v.TLS = &temporalTLSView{Enabled: true, CA: t.TLS.CA, Cert: t.TLS.Cert, Key: t.TLS.Key, ServerName: t.TLS.ServerName}
	}
	return v
}
