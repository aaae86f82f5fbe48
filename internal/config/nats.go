package config

import (
	"net/url"
	"strings"

	"go.yaml.in/yaml/v3"
)

// NATS is the nats section: the NATS cluster of `server` and `worker` (and
// of `dev` instead of the embedded one).
//
//	nats:
//	  url: [nats://nats-0:4222, nats://nats-1:4222, nats://nats-2:4222]   # --nats-url; a string or a list
//	  creds: /etc/countersign/countersign.creds   # --nats-creds: a user JWT and nkey seed
//	  nkey: /etc/countersign/countersign.nk       # --nats-nkey: an nkey seed file (instead of creds)
//	  tls:
//	    ca: /etc/countersign/nats-ca.pem          # --nats-tls-ca
//	    cert: /etc/countersign/nats-client.pem    # --nats-tls-cert, with key
//	    key: /etc/countersign/nats-client.key     # --nats-tls-key
//	  replicas: 3                                 # --nats-replicas
type NATS struct {
	// URLs are the servers to connect to; the client picks among them.
	URLs     []string
	Creds    string
	NKey     string
	TLS      NATSTLS
	Replicas int
}

// NATSTLS is nats.tls. Paths are absolute.
type NATSTLS struct {
	CA, Cert, Key string
}

// URL is the URLs as the NATS client takes them (comma-separated).
func (n NATS) URL() string { return strings.Join(n.URLs, ",") }

// MaxNATSReplicas bounds nats.replicas (JetStream's limit).
const MaxNATSReplicas = 5

var (
	natsFields    = []string{"url", "creds", "nkey", "tls", "replicas"}
	natsTLSFields = []string{"ca", "cert", "key"}
	natsSchemes   = []string{"nats", "tls", "ws", "wss"}
)

func (d *decoder) nats(f *File, v *yaml.Node) {
	n := &f.NATS
	var credsLine, nkeyLine int
	d.section(v, "nats", natsFields, func(key, sub string, k, v *yaml.Node) {
		switch key {
		case "url":
			for _, s := range d.stringList(v, sub) {
				for _, one := range strings.Split(s, ",") {
					if one = strings.TrimSpace(one); d.natsURL(v, sub, one) {
						n.URLs = append(n.URLs, one)
					}
				}
			}
		case "creds":
			credsLine = k.Line
			n.Creds = d.filePath(v, sub)
		case "nkey":
			nkeyLine = k.Line
			n.NKey = d.filePath(v, sub)
		case "tls":
			var certLine, keyLine int
			d.section(v, sub, natsTLSFields, func(key, tsub string, k, v *yaml.Node) {
				switch key {
				case "ca":
					n.TLS.CA = d.filePath(v, tsub)
				case "cert":
					certLine = k.Line
					n.TLS.Cert = d.filePath(v, tsub)
				case "key":
					keyLine = k.Line
					n.TLS.Key = d.filePath(v, tsub)
				}
			})
			d.pair(sub, "cert", certLine, "key", keyLine)
		case "replicas":
			n.Replicas = d.positiveInt(v, sub, MaxNATSReplicas)
		}
	})
	if credsLine != 0 && nkeyLine != 0 {
		d.addf(nkeyLine, "nats.nkey", "creds (line %d) and nkey exclude each other: creds holds its own nkey seed", credsLine)
	}
}

// natsURL checks one NATS server URL. It never echoes a password.
func (d *decoder) natsURL(v *yaml.Node, field, s string) bool {
	u, err := url.Parse(s)
	switch {
	case s == "":
		d.addf(v.Line, field, "an empty URL")
	case err != nil:
		d.addf(v.Line, field, "not a URL")
	case !strings.Contains(s, "://") || !containsFold(natsSchemes, u.Scheme):
		d.addf(v.Line, field, "must be a nats://, tls://, ws:// or wss:// URL")
	case u.Hostname() == "":
		d.addf(v.Line, field, "must have a host")
	case u.User != nil:
		d.addf(v.Line, field, "must not carry user:password or a token; use creds or nkey")
	default:
		return true
	}
	return false
}

func containsFold(list []string, s string) bool {
	for _, e := range list {
		if strings.EqualFold(e, s) {
			return true
		}
	}
	return false
}

type natsView struct {
	URL      []string     `yaml:"url,omitempty,flow"`
	Creds    string       `yaml:"creds,omitempty"`
	NKey     string       `yaml:"nkey,omitempty"`
	TLS      *natsTLSView `yaml:"tls,omitempty"`
	Replicas int          `yaml:"replicas,omitempty"`
}

type natsTLSView struct {
	CA   string `yaml:"ca,omitempty"`
	Cert string `yaml:"cert,omitempty"`
	Key  string `yaml:"key,omitempty"`
}

// view is the printed form of the section; nil when it is empty.
func (n NATS) view() *natsView {
	if len(n.URLs) == 0 && n.Creds == "" && n.NKey == "" && n.TLS == (NATSTLS{}) && n.Replicas == 0 {
		return nil
	}
	v := &natsView{URL: n.URLs, Creds: n.Creds, NKey: n.NKey, Replicas: n.Replicas}
	if n.TLS != (NATSTLS{}) {
		v.TLS = &natsTLSView{CA: n.TLS.CA, Cert: n.TLS.Cert, Key: n.TLS.Key}
	}
	return v
}
