// Prints the frames the Go runtime itself names for its own stack (runtime.Callers and
// runtime.CallersFrames), from a leaf reached through calls the compiler inlines, a method, a
// closure and a goroutine: the oracle the tests hold memdiag's reading of the function table to.
// One line per frame: "PC FUNCTION LINE", then "ready PID"; it then waits to be read.
package main

import (
	"fmt"
	"os"
	"runtime"
	"time"
)

func leaf() []uintptr {
	pcs := make([]uintptr, 64)
	return pcs[:runtime.Callers(1, pcs)]
}

func middle() []uintptr { return leaf() }

type orders struct{ n int }

func (o *orders) method() []uintptr {
	o.n++
	return middle()
}

func show(pcs []uintptr) {
	frames := runtime.CallersFrames(pcs)
	for {
		f, more := frames.Next()
		fmt.Printf("%#x %s %d\n", f.PC, f.Function, f.Line)
		if !more {
			return
		}
	}
}

func main() {
	o := &orders{}
	show(o.method())
	done := make(chan []uintptr)
	go func() { done <- func() []uintptr { return middle() }() }()
	show(<-done)
	fmt.Printf("ready %d\n", os.Getpid())
	time.Sleep(time.Hour)
}
