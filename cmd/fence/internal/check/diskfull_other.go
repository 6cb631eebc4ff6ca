//go:build !linux

package check

import "errors"

var errNoSmallDisks = errors.New("the disk-full fault mounts a small tmpfs for each node, which needs Linux")

func canFillDisks() error { return errNoSmallDisks }

func mountSmallDisk(string, int64) error { return errNoSmallDisks }

func unmountSmallDisk(string) error { return errNoSmallDisks }
