//go:build !noprofile

// The service writes a heap profile on SIGUSR1, as many do: a program that references
// runtime/pprof's heap profile keeps the runtime's allocation sampling on. Built with
// -tags noprofile it does not, and the linker switches the heap profile off.
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
			_ = pprof.WriteHeapProfile(os.Stderr)
		}
	}()
}
