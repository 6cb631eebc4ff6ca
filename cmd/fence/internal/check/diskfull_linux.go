package check

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// canFillDisks says why the disk-full fault cannot run here, if it cannot:
// it mounts a small tmpfs per node, which needs root.
func canFillDisks() error {
	if os.Geteuid() != 0 {
		return errors.New("the disk-full fault mounts a small tmpfs for each node, which needs root")
	}
	return nil
}

func mountSmallDisk(dir string, size int64) error {
	return syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, fmt.Sprintf("size=%d,mode=0700", size))
}

func unmountSmallDisk(dir string) error {
	return syscall.Unmount(dir, syscall.MNT_DETACH)
}
