module github.com/zodbd/zodbd

go 1.26.8

require github.com/kisielk/og-rek v1.3.0

require (
	github.com/aristanetworks/gomap v0.0.0-20230726210543-f4e41046dced // indirect
	golang.org/x/exp v0.0.0-20230725093048-515e97ebf090 // indirect
)
