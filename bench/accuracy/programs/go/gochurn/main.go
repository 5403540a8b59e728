// A service making short-lived garbage over a small fixed live set: the Go heap rises to its GC
// goal and falls at each collection (a GC sawtooth). gochurn RATE
package main

import (
	"fmt"
	"os"
	"strconv"
	"time"
)

var live [512][]byte

//go:noinline
func handle(n int) byte {
	scratch := make([]byte, 32*1024)
	scratch[n%len(scratch)] = byte(n)
	live[n%len(live)] = make([]byte, 1024)
	return scratch[n%len(scratch)]
}

func main() {
	rate := 20000
	if len(os.Args) > 1 {
		rate, _ = strconv.Atoi(os.Args[1])
	}
	fmt.Printf("ready %d\n", os.Getpid())
	var sink byte
	for n := 0; ; {
		for i := 0; i < rate/100; i++ {
			sink += handle(n)
			n++
		}
		time.Sleep(10 * time.Millisecond)
		if sink == 255 && n < 0 {
			fmt.Println(sink)
		}
	}
}
