// Command psyche creates, runs and joins decentralized training runs.
package main

import "os"

func main() { os.Exit(run(os.Args, os.Stdout, os.Stderr)) }
