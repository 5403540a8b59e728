//go:build !noprofile

// The service writes its heap profile on SIGUSR1 (to $HEAP_PROFILE, or stderr), as many do: a
// program that references runtime/pprof's heap profile keeps the runtime's allocation sampling
// on. Built with -tags noprofile it does not, and the linker switches the heap profile off.
package main

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
			out := os.Stderr
			if path := os.Getenv("HEAP_PROFILE"); path != "" {
				if f, err := os.Create(path + ".tmp"); err == nil {
					_ = pprof.WriteHeapProfile(f)
					_ = f.Close()
					_ = os.Rename(path+".tmp", path)
					continue
				}
			}
			_ = pprof.WriteHeapProfile(out)
		}
	}()
}
