//go:build !noprofile

package kit

// The programs write their heap profile on SIGUSR1 (to $HEAP_PROFILE, or stderr), as many services
// do: a program that references runtime/pprof's heap profile keeps the runtime's allocation
// sampling on. Built with -tags noprofile this file is left out, and the linker switches the heap
// profile off (runtime.disableMemoryProfiling).

import (
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"
)

func init() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGUSR1)
	go func() {
		for range c {
			writeHeapProfile()
		}
	}()
}

func writeHeapProfile() {
	path := os.Getenv("HEAP_PROFILE")
	if path == "" {
		_ = pprof.WriteHeapProfile(os.Stderr)
		return
	}
	if f, err := os.Create(path + ".tmp"); err == nil {
		_ = pprof.WriteHeapProfile(f)
		_ = f.Close()
		_ = os.Rename(path+".tmp", path)
	}
}
