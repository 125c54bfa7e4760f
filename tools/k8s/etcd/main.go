// Command etcd is the etcd server, built from the published etcd server
// module so the test cluster needs no downloaded release binary.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
