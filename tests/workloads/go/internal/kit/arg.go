// Package kit holds what the Go test programs share: their arguments and, unless built with
// -tags noprofile, the heap profile they write on SIGUSR1.
package kit

import (
	"os"
	"strconv"
)

// Arg is the i-th command-line argument as a number, or fallback.
func Arg(i, fallback int) int {
	if len(os.Args) > i {
		if v, err := strconv.Atoi(os.Args[i]); err == nil {
			return v
		}
	}
	return fallback
}

// PerTick splits a rate per second into the work of one 50 ms tick (at least one).
func PerTick(perSecond int) int {
	if n := perSecond / 20; n > 0 {
		return n
	}
	return 1
}
