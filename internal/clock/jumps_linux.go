package clock

import (
	"time"

	"golang.org/x/sys/unix"
)

// readOffsets returns CLOCK_BOOTTIME and CLOCK_REALTIME less
// CLOCK_MONOTONIC, Go's monotonic clock on Linux. The monotonic clock is
// read before and after the other two, and the offsets taken from the
// reading after: a thread descheduled between the reads makes an offset
// smaller, never larger. A reading whose bracket is wider than a tenth of
// minJump is taken again (three times at most), so that a later exact one
// does not count the gap as a jump.
func readOffsets() (boot, wall time.Duration, ok bool) {
	for range 3 {
		before, b, w, after, err := readClocks()
		if err != nil {
			return 0, 0, false
		}
		boot, wall = b-after, w-after
		if after-before < minJump/10 {
			break
		}
	}
	return boot, wall, true
}

func readClocks() (before, boot, wall, after time.Duration, err error) {
	var ts unix.Timespec
	read := func(id int32) time.Duration {
		if err == nil {
			err = unix.ClockGettime(id, &ts)
		}
		return time.Duration(ts.Nano())
	}
	before = read(unix.CLOCK_MONOTONIC)
	boot = read(unix.CLOCK_BOOTTIME)
	wall = read(unix.CLOCK_REALTIME)
	after = read(unix.CLOCK_MONOTONIC)
	return before, boot, wall, after, err
}
