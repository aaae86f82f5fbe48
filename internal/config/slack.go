package config

import (
	"strings"

	"go.yaml.in/yaml/v3"
)

// Slack is the slack section: approval messages in Slack.
//
//	slack:
//	  token: ${SLACK_BOT_TOKEN}                 # --slack-token; notifications are off without it
//	  channel: "#approvals"                    # --slack-channel
//	  signing_secret: ${file:/run/secrets/slack-signing-secret}   # --slack-signing-secret
//	  api_url: https://slack-gov.com/api/      # --slack-api-url (GovSlack, a proxy)
//
// Token and SigningSecret are secrets: resolved from ${NAME} or ${file:…},
// redacted when printed.
type Slack struct {
	Token, Channel, SigningSecret, APIURL string
}

var slackFields = []string{"token", "channel", "signing_secret", "api_url"}

func (d *decoder) slack(f *File, v *yaml.Node) {
	s := &f.Slack
	var tokenLine int
	lines := map[string]int{}
	d.section(v, "slack", slackFields, func(key, sub string, k, v *yaml.Node) {
		lines[key] = k.Line
		switch key {
		case "token":
			tokenLine = k.Line
			s.Token = d.secret(v, sub)
			if s.Token != "" && !strings.HasPrefix(s.Token, "xox") {
				// The message names the kind of token, never the value.
				d.addf(v.Line, sub, "is not a Slack bot token (xoxb-…)")
				s.Token = ""
			}
		case "channel":
			s.Channel = d.nonEmpty(v, sub)
		case "signing_secret":
			s.SigningSecret = d.secret(v, sub)
		case "api_url":
			s.APIURL = d.absURL(v, sub)
		}
	})
	if tokenLine == 0 {
		for _, key := range []string{"channel", "signing_secret", "api_url"} {
			if lines[key] != 0 {
				d.addf(lines[key], "slack."+key, "needs slack.token")
			}
		}
	}
}

type slackView struct {
	Token         string `yaml:"token,omitempty"`
	Channel       string `yaml:"channel,omitempty"`
	SigningSecret string `yaml:"signing_secret,omitempty"`
	APIURL        string `yaml:"api_url,omitempty"`
}

// view is the printed form of a redacted section; nil when it is empty.
func (s Slack) view() *slackView {
	if s == (Slack{}) {
		return nil
	}
	return &slackView{Token: s.Token, Channel: s.Channel, SigningSecret: s.SigningSecret, APIURL: s.APIURL}
}
