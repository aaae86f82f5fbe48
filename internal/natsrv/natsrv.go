// Package natsrv runs an embedded NATS server with JetStream, for
// `countersign dev` and for tests that need the real broker.
//
// # Who may connect
//
// Every connection authenticates; there is no anonymous user. Start makes a
// random password for each user, held only in this process's memory and
// different at every start.
//
// The server's own user (Connect) has full access to the global account, where
// all of Countersign's state lives (the task read model, tokens, passkeys,
// the ledger, the audit chains).
//
// With Options.Clients set (countersign dev), the own user may connect only
// in process (nats.InProcessServer: no socket at all), so its password works
// on no port. The TCP listener (loopback) serves one other user, for
// processes outside this one, in an account of its own: it reaches the own
// account only through what Clients exports (request/reply services, and a
// copy of some JetStream streams). Being a separate account is what keeps it
// out: with per-subject permissions alone, a client could still name an
// own-account subject (say, a KV key of the token bucket) as the reply
// subject of a request, or as the deliver subject of a JetStream consumer, and
// the server would write there for it.
//
// Without Options.Clients (tests), the own user may also connect over TCP,
// and URL carries its credentials.
package natsrv

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Users and accounts.
const (
	// OwnUser is the server's own user: full access to the global account.
	OwnUser = "countersign"
	// ClientsAccount holds Options.Clients.User.
	ClientsAccount = "CLIENTS"
	// clientsAdmin is an in-process-only user of ClientsAccount that sets up
	// the stream copies at Start.
	clientsAdmin = "countersign-clients-admin"

	// Connection types (nats-server's jwt.ConnectionType*).
	connInProcess = "IN_PROCESS"
	connStandard  = "STANDARD"
)

// Options configures the embedded server.
type Options struct {
	// StoreDir is where JetStream keeps its files. Empty means a temporary
	// directory chosen by the server (tests only: data is not kept).
	StoreDir string
	// Host and Port to listen on. Zero Port picks a free port. Host defaults
	// to 127.0.0.1: the embedded server is never exposed beyond loopback.
	Host string
	Port int
	// Clients, when set, limits the own user to in-process connections and
	// opens the TCP port to other processes as described by Clients. Nil
	// leaves the own user reachable over TCP (URL), for tests.
	Clients *Clients
}

// Clients is what processes outside this one may do. They connect as User,
// with a random password (ClientURL), in ClientsAccount.
type Clients struct {
	// User is the user name.
	User string
	// Services are subjects (wildcards allowed) clients may send requests to;
	// the own account answers them. Replies reach only the requester.
	// Clients may not subscribe to them.
	Services []string
	// Streams are JetStream streams of the own account that clients may read.
	// A stream of the same configuration is kept in ClientsAccount, fed with
	// every message the own account publishes on its subjects from now on;
	// clients may create consumers on it but neither publish on its subjects
	// nor create, change, purge or delete streams.
	Streams []jetstream.StreamConfig
}

// Server is a running embedded NATS server.
type Server struct {
	srv      *server.Server
	ownPass  string
	admPass  string // clientsAdmin's
	clients  *Clients
	cliPass  string
	listenOn string // host:port of the TCP listener
}

// Start starts the server and waits until it accepts connections.
func Start(opts Options) (_ *Server, err error) {
	host := opts.Host
	if host == "" {
		host = "127.0.0.1"
	}
	port := opts.Port
	if port == 0 {
		port = server.RANDOM_PORT
	}
	if c := opts.Clients; c != nil && (c.User == "" || c.User == OwnUser || c.User == clientsAdmin) {
		return nil, fmt.Errorf("natsrv: invalid client user name %q", c.User)
	}
	s := &Server{ownPass: newPassword(), clients: opts.Clients}
	so := &server.Options{
		ServerName: "countersign-embedded",
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   opts.StoreDir,
		NoLog:      true,
		NoSigs:     true,
		// Deny writes larger than any record we store; tool arguments are
		// capped well below this at the MCP edge.
		MaxPayload: 8 << 20,
	}
	if opts.Clients == nil {
		so.Users = []*server.User{{Username: OwnUser, Password: s.ownPass}}
	} else {
		s.cliPass, s.admPass = newPassword(), newPassword()
		if err := s.clientAccounts(so); err != nil {
			return nil, err
		}
	}
	srv, err := server.NewServer(so)
	if err != nil {
		return nil, fmt.Errorf("natsrv: %w", err)
	}
	s.srv = srv
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return nil, errors.New("natsrv: embedded NATS did not become ready within 10s")
	}
	if addr, ok := srv.Addr().(*net.TCPAddr); ok {
		s.listenOn = net.JoinHostPort(host, strconv.Itoa(addr.Port))
	}
	if opts.Clients != nil {
		defer func() {
			if err != nil {
				s.Shutdown()
			}
		}()
		if err := s.enableClients(); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// clientAccounts configures the global account (the own user, exports) and
// ClientsAccount (the client user, imports).
func (s *Server) clientAccounts(so *server.Options) error {
	c := s.clients
	own := server.NewAccount(server.DEFAULT_GLOBAL_ACCOUNT)
	cli := server.NewAccount(ClientsAccount)
	var denyPub []string
	for _, subj := range c.Services {
		if err := own.AddServiceExport(subj, []*server.Account{cli}); err != nil {
			return fmt.Errorf("natsrv: export %s: %w", subj, err)
		}
		if err := cli.AddServiceImport(own, subj, ""); err != nil {
			return fmt.Errorf("natsrv: import %s: %w", subj, err)
		}
	}
	for _, st := range c.Streams {
		for _, subj := range st.Subjects {
			if err := own.AddStreamExport(subj, []*server.Account{cli}); err != nil {
				return fmt.Errorf("natsrv: export %s: %w", subj, err)
			}
			if err := cli.AddStreamImport(own, subj, ""); err != nil {
				return fmt.Errorf("natsrv: import %s: %w", subj, err)
			}
			denyPub = append(denyPub, subj)
		}
	}
	// Stream administration; consumers stay allowed.
	for _, op := range []string{"CREATE", "UPDATE", "DELETE", "PURGE", "MSG.DELETE", "SNAPSHOT", "RESTORE", "PEER.REMOVE", "LEADER.STEPDOWN"} {
		denyPub = append(denyPub, "$JS.API.STREAM."+op+".>")
	}
	so.Accounts = []*server.Account{own, cli}
	so.Users = []*server.User{
		{Username: OwnUser, Password: s.ownPass, Account: own, AllowedConnectionTypes: connTypes(connInProcess)},
		{Username: clientsAdmin, Password: s.admPass, Account: cli, AllowedConnectionTypes: connTypes(connInProcess)},
		{Username: c.User, Password: s.cliPass, Account: cli, AllowedConnectionTypes: connTypes(connStandard),
			Permissions: &server.Permissions{
				Publish:   &server.SubjectPermission{Deny: denyPub},
				Subscribe: &server.SubjectPermission{Deny: append([]string(nil), c.Services...)},
			}},
	}
	return nil
}

// enableClients turns JetStream on in both accounts (with accounts
// configured, the server does not do it for the global account by itself; its
// data stays where a server without accounts keeps it) and sets up the
// stream copies in ClientsAccount.
func (s *Server) enableClients() error {
	for _, name := range []string{server.DEFAULT_GLOBAL_ACCOUNT, ClientsAccount} {
		acc, err := s.srv.LookupAccount(name)
		if err != nil {
			return fmt.Errorf("natsrv: account %s: %w", name, err)
		}
		if !acc.JetStreamEnabled() {
			if err := acc.EnableJetStream(nil, nil); err != nil {
				return fmt.Errorf("natsrv: enable JetStream for %s: %w", name, err)
			}
		}
	}
	if len(s.clients.Streams) == 0 {
		return nil
	}
	nc, err := nats.Connect("", nats.InProcessServer(s.srv), nats.UserInfo(clientsAdmin, s.admPass), nats.Name("countersign-clients-admin"))
	if err != nil {
		return fmt.Errorf("natsrv: connect to the clients account: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("natsrv: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, st := range s.clients.Streams {
		if _, err := js.CreateOrUpdateStream(ctx, st); err != nil {
			return fmt.Errorf("natsrv: stream %s for clients: %w", st.Name, err)
		}
	}
	return nil
}

func connTypes(types ...string) map[string]struct{} {
	m := make(map[string]struct{}, len(types))
	for _, t := range types {
		m[t] = struct{}{}
	}
	return m
}

func newPassword() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b)
}

// Connect connects the own user in process (no socket). opts add to the
// connection's options.
func (s *Server) Connect(opts ...nats.Option) (*nats.Conn, error) {
	all := append([]nats.Option{nats.InProcessServer(s.srv), nats.UserInfo(OwnUser, s.ownPass)}, opts...)
	nc, err := nats.Connect("", all...)
	if err != nil {
		return nil, fmt.Errorf("natsrv: connect in process: %w", err)
	}
	return nc, nil
}

// Addr is the TCP client URL without credentials, e.g.
// "nats://127.0.0.1:4222".
func (s *Server) Addr() string { return "nats://" + s.listenOn }

// URL is the TCP client URL with the own user's credentials: full access,
// for tests. It is empty when Options.Clients is set (the own user cannot
// connect over TCP then).
func (s *Server) URL() string {
	if s.clients != nil {
		return ""
	}
	return s.urlFor(OwnUser, s.ownPass)
}

// ClientURL is the TCP client URL with the credentials of Options.Clients.User;
// empty without Options.Clients. It changes at every start.
func (s *Server) ClientURL() string {
	if s.clients == nil {
		return ""
	}
	return s.urlFor(s.clients.User, s.cliPass)
}

func (s *Server) urlFor(user, pass string) string {
	u := url.URL{Scheme: "nats", User: url.UserPassword(user, pass), Host: s.listenOn}
	return u.String()
}

// Shutdown stops the server and waits for it to exit. It is safe to call more
// than once.
func (s *Server) Shutdown() {
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
}
