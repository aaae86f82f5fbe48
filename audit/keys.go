package audit

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
)

// KeyID derives the key ID of an Ed25519 public key.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return "ed25519-" + hex.EncodeToString(sum[:16])
}

// currentFile names the key that signs new records.
const currentFile = "current"

// Keyring holds the server's audit signing keys: every key ever used (so
// their public halves can be published) and the current one. Keys live in
// one directory as PKCS#8 PEM files named <keyId>.pem; the file "current"
// holds the key ID that signs.
type Keyring struct {
	dir     string
	mu      sync.RWMutex
	keys    map[string]ed25519.PrivateKey
	current string
	// created: OpenKeyring made the current key, the directory having
	// none.
	created bool
}

// OpenKeyring loads the keys in dir, creating the directory and a first key
// when there is none.
func OpenKeyring(dir string) (*Keyring, error) {
	if dir == "" {
		return nil, errors.New("audit: key directory is required")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("audit: key directory: %w", err)
	}
	keys, err := readKeys(dir)
	if err != nil {
		return nil, err
	}
	k := &Keyring{dir: dir, keys: keys}
	if k.current, err = readCurrent(dir, keys); err != nil {
		return nil, err
	}
	if k.current == "" {
		if _, err := k.Rotate(); err != nil {
			return nil, err
		}
		k.created = true
	}
	return k, nil
}

// Created reports whether OpenKeyring made the key the keyring signs with,
// the directory having no current key: right for a first start, and a
// mistake for a process of a deployment whose processes must share one
// key directory but was pointed at another.
func (k *Keyring) Created() bool {
	return k.created
}

// readCurrent returns the key ID the current file of dir names, "" when
// there is no such file; the key must be among keys.
func readCurrent(dir string, keys map[string]ed25519.PrivateKey) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, currentFile))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("audit: read current key: %w", err)
	}
	id := strings.TrimSpace(string(b))
	if _, ok := keys[id]; !ok {
		return "", fmt.Errorf("audit: current key %q is not in %s", id, dir)
	}
	return id, nil
}

// readKeys reads every key in dir, by key ID.
func readKeys(dir string) (map[string]ed25519.PrivateKey, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.pem"))
	if err != nil {
		return nil, err
	}
	keys := make(map[string]ed25519.PrivateKey, len(files))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("audit: read key: %w", err)
		}
		blk, _ := pem.Decode(b)
		if blk == nil || blk.Type != "PRIVATE KEY" {
			return nil, fmt.Errorf("audit: %s is not a PEM private key", f)
		}
		pk, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("audit: %s: %w", f, err)
		}
		priv, ok := pk.(ed25519.PrivateKey)
		if !ok {
			return nil, fmt.Errorf("audit: %s is not an Ed25519 key", f)
		}
		id := KeyID(priv.Public().(ed25519.PublicKey))
		if filepath.Base(f) != id+".pem" {
			return nil, fmt.Errorf("audit: %s holds key %s; its name must be %s.pem", f, id, id)
		}
		keys[id] = priv
	}
	return keys, nil
}

// reload adds the keys written to the directory since the keyring read it
// (a rotation by another process sharing the directory); the current key
// stays this keyring's.
func (k *Keyring) reload() error {
	keys, err := readKeys(k.dir)
	if err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for id, priv := range keys {
		if _, ok := k.keys[id]; !ok {
			k.keys[id] = priv
		}
	}
	return nil
}

// Refresh reads the directory again, as a rotation elsewhere changes it
// (`countersign audit rotate-key`, or a new copy of a mounted secret): it
// adds the keys written since, and signs from now on with the key the
// current file names. It returns that key's ID and whether it changed. On
// an error (a file that does not parse, a current file naming a key that
// is not there, no current file) nothing changes and the keyring signs on
// with the key it had.
func (k *Keyring) Refresh() (current string, changed bool, err error) {
	keys, err := readKeys(k.dir)
	if err != nil {
		return k.CurrentID(), false, err
	}
	id, err := readCurrent(k.dir, keys)
	if err == nil && id == "" {
		err = fmt.Errorf("audit: %s has no current key file", k.dir)
	}
	if err != nil {
		return k.CurrentID(), false, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for kid, priv := range keys {
		if _, ok := k.keys[kid]; !ok {
			k.keys[kid] = priv
		}
	}
	changed = id != k.current
	k.current = id
	return id, changed, nil
}

// publicKeys returns the public half of every key, by key ID.
func (k *Keyring) publicKeys() map[string]ed25519.PublicKey {
	k.mu.RLock()
	defer k.mu.RUnlock()
	out := make(map[string]ed25519.PublicKey, len(k.keys))
	for id, priv := range k.keys {
		out[id] = priv.Public().(ed25519.PublicKey)
	}
	return out
}

// Rotate makes a new key the current one; the old keys stay for their
// public halves. It returns the new key ID.
func (k *Keyring) Rotate() (string, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", err
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return "", err
	}
	id := KeyID(pub)
	if err := writeFileAtomic(filepath.Join(k.dir, id+".pem"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})); err != nil {
		return "", fmt.Errorf("audit: write key: %w", err)
	}
	if err := writeFileAtomic(filepath.Join(k.dir, currentFile), []byte(id+"\n")); err != nil {
		return "", fmt.Errorf("audit: write current key: %w", err)
	}
	k.mu.Lock()
	k.keys[id] = priv
	k.current = id
	k.mu.Unlock()
	return id, nil
}

func writeFileAtomic(p string, b []byte) error {
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

// CurrentID is the ID of the signing key.
func (k *Keyring) CurrentID() string {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.current
}

// signWith signs msg with the key id, one the keyring holds (it never
// drops a key).
func (k *Keyring) signWith(id string, msg []byte) []byte {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return ed25519.Sign(k.keys[id], msg)
}

// PublicKeys returns the public halves of every key, oldest ID order aside,
// sorted by key ID.
func (k *Keyring) PublicKeys() []ed25519.PublicKey {
	k.mu.RLock()
	defer k.mu.RUnlock()
	ids := make([]string, 0, len(k.keys))
	for id := range k.keys {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	out := make([]ed25519.PublicKey, 0, len(ids))
	for _, id := range ids {
		out = append(out, k.keys[id].Public().(ed25519.PublicKey))
	}
	return out
}

// PublicKeysPEM encodes every public key as a PKIX "PUBLIC KEY" PEM block:
// the file an auditor passes to `countersign audit verify --key`.
func (k *Keyring) PublicKeysPEM() []byte {
	return EncodePublicKeys(k.PublicKeys())
}

// EncodePublicKeys encodes keys as concatenated PKIX PEM blocks.
func EncodePublicKeys(keys []ed25519.PublicKey) []byte {
	var out []byte
	for _, pub := range keys {
		der, err := x509.MarshalPKIXPublicKey(pub)
		if err != nil {
			continue // cannot happen for a valid Ed25519 key
		}
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})...)
	}
	return out
}

// ParsePublicKeys reads every PKIX "PUBLIC KEY" PEM block in b; each must be
// an Ed25519 key.
func ParsePublicKeys(b []byte) ([]ed25519.PublicKey, error) {
	var out []ed25519.PublicKey
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		if blk.Type != "PUBLIC KEY" {
			return nil, fmt.Errorf("audit: PEM block %q is not a PUBLIC KEY", blk.Type)
		}
		k, err := x509.ParsePKIXPublicKey(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("audit: public key: %w", err)
		}
		pub, ok := k.(ed25519.PublicKey)
		if !ok {
			return nil, errors.New("audit: public key is not Ed25519")
		}
		out = append(out, pub)
	}
	if len(out) == 0 {
		return nil, errors.New("audit: no PEM public key found")
	}
	return out, nil
}
