// The forwarder on one existing Linux VM: its identity attached, the installer run by the
// Custom Script Extension. (A VM takes one Custom Script Extension; see docs/deploy.md.)

@description('Name of the existing VM (in the deployment\'s resource group).')
param vmName string

@description('Resource id of the forwarders\' user-assigned identity.')
param forwarderIdentityResourceId string

@description('Attach the identity (merged with the VM\'s current identities).')
param attachIdentity bool = true

@description('Shell command the Custom Script Extension runs (built by forwarder.bicep; nothing secret).')
param installCommand string

@description('Changing it reruns the extension.')
param forceUpdateTag string

resource vm 'Microsoft.Compute/virtualMachines@2024-07-01' existing = {
  name: vmName
}

// The VM is read here and written in a nested module: one template cannot declare the same VM
// both as existing and as deployed, and the write must keep the identities already attached.
var currentIdentity = vm.?identity ?? {}
var keepsSystemAssigned = contains(string(currentIdentity.?type ?? 'None'), 'SystemAssigned')

module identity 'vm-identity.bicep' = if (attachIdentity) {
  name: '${take('sebridge-vm-identity-${vmName}', 50)}-${uniqueString(vmName)}'
  params: {
    vmName: vmName
    location: vm.location
    identityType: keepsSystemAssigned ? 'SystemAssigned, UserAssigned' : 'UserAssigned'
    userAssignedIdentities: union(currentIdentity.?userAssignedIdentities ?? {}, {
      '${forwarderIdentityResourceId}': {}
    })
  }
}

resource installer 'Microsoft.Compute/virtualMachines/extensions@2024-07-01' = {
  parent: vm
  name: 'sebridge-forwarder'
  location: vm.location
  properties: {
    publisher: 'Microsoft.Azure.Extensions'
    type: 'CustomScript'
    typeHandlerVersion: '2.1'
    autoUpgradeMinorVersion: true
    forceUpdateTag: forceUpdateTag
    // Protected: kept out of the VM model that every reader of the VM can see.
    protectedSettings: {
      commandToExecute: installCommand
    }
  }
  dependsOn: [
    identity
  ]
}
