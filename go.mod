module github.com/zodbd/zodbd

go 1.26.8
