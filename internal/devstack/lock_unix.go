//go:build unix

package devstack

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

const lockFile = "temporal.lock"

// lockDataDir takes an exclusive, non-blocking flock on DataDir/temporal.lock
// for the life of the server: two servers on one SQLite file would fight over
// the history shard. The kernel drops the lock if the process dies.
func lockDataDir(dir string) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("devstack: lock data dir: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s", ErrDataDirInUse, dir)
		}
		return nil, fmt.Errorf("devstack: lock data dir: %w", err)
	}
	return func() { f.Close() }, nil
}
